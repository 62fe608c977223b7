"""Tolerance checks whose failure messages teach.

All comparisons run in the trusted process on plain tensors rebuilt from bytes. A failure
raises ``Mismatch``, an AssertionError carrying two messages: the full one for public tests
(expected, got, worst element, likely cause) and one for hidden tests that keeps the cause
but no values, which would make feedback an oracle for the hidden expected outputs.
"""

from __future__ import annotations

from typing import Sequence

import torch

from grader.sandbox.usage import warmup_allowance


class Mismatch(AssertionError):
    """A check failed. ``str()`` is the public message; ``hidden`` the value-free one."""

    def __init__(self, public: str, hidden: str | None = None, hint: str = ""):
        super().__init__(public)
        self.public = public
        self.hidden = hidden if hidden is not None else public
        self.hint = hint        # the test's own guess at a cause (unchecked), if any

    def without_hint(self, text: str) -> str:
        """``text`` without the test's guessed cause: once a checked diagnosis names the
        mistake, a guess that may contradict it is left out."""
        return text.replace(f" Likely cause: {self.hint}", "") if self.hint else text


def _axes_text(shape, axes) -> str:
    if axes and len(axes) == len(shape):
        return "(" + ", ".join(axes) + ") = " + str(tuple(shape))
    return str(tuple(shape))


def _shape_hint(actual: tuple, expected: tuple, axes) -> str:
    if sorted(actual) == sorted(expected) and actual != expected:
        swapped = [i for i, (a, e) in enumerate(zip(actual, expected, strict=False)) if a != e]
        if len(swapped) == 2:
            i, j = swapped
            names = (f"{axes[i]} and {axes[j]}" if axes and len(axes) == len(expected)
                     else f"dims {i} and {j}")
            return f": {names} look swapped (did you forget transpose({i}, {j})?)"
        return ": the sizes are right but in another order (a missing transpose/permute?)"
    if len(actual) != len(expected):
        return ": a different number of dimensions (a missing split/merge of heads, or a squeeze?)"
    return ""


MAX_LISTED = 6          # indices named one by one in a description; past it, a count


def _where(bad: torch.Tensor, axes) -> str:
    """Which slices hold the differences: the axes along which only some indices differ
    (at most two, the most confined first), e.g. "only at seq_q 0, 3 (2 of 8)"."""
    if bad.dim() == 0 or (bad.dim() == 1 and not axes):
        return ""               # a flat selection of elements: its positions mean nothing
    named = axes if axes and len(axes) == bad.dim() else [f"dim {i}" for i in range(bad.dim())]
    confined = []
    for d in range(bad.dim()):
        size = bad.shape[d]
        if size < 2:
            continue
        others = [i for i in range(bad.dim()) if i != d]
        hit = bad.any(dim=others) if others else bad
        idx = hit.nonzero().flatten().tolist()
        if 0 < len(idx) <= size // 2:          # confined to a minority: worth naming
            confined.append((len(idx) / size, named[d], idx, size))
    if not confined:
        return ""
    confined.sort(key=lambda c: c[0])
    parts = []
    for _, axis, idx, size in confined[:2]:
        listed = ", ".join(map(str, idx)) if len(idx) <= MAX_LISTED else f"{len(idx)} indices"
        parts.append(f"{axis} {listed} ({len(idx)} of {size})")
    return "only at " + " and ".join(parts)


def _normalised_along(a64: torch.Tensor, e64: torch.Tensor, axes=None) -> str:
    """Distributions along the wrong axis: the expected values sum to 1 along the last axis
    (attention weights), yours along another one (a softmax over the wrong axis?)."""
    if a64.dim() < 2 or not bool((e64 >= 0).all()):
        return ""
    ones = torch.ones((), dtype=a64.dtype)
    rows = e64.sum(dim=-1)
    if not bool(((rows - ones).abs() < 1e-4).all()):
        return ""
    if bool(((a64.sum(dim=-1) - ones).abs() < 1e-4).all()):
        return ""
    for d in range(a64.dim() - 1):
        if a64.shape[d] > 1 and bool(((a64.sum(dim=d) - ones).abs() < 1e-4).all()):
            axis = axes[d] if axes and len(axes) == a64.dim() else f"dim {d}"
            last = axes[-1] if axes and len(axes) == a64.dim() else "the last axis"
            return (f"your values sum to 1 along {axis} instead of {last} (a softmax over "
                    "the wrong axis?)")
    return ""


def _pattern(a64: torch.Tensor, e64: torch.Tensor, bad: torch.Tensor, *,
             hidden: bool, axes=None) -> str:
    """What the differing values have in common, in words (no expected value for hidden
    tests): zeros where numbers belong, one constant factor or offset, a transpose, the sign,
    float32 rounding, small differences everywhere."""
    normalised = _normalised_along(a64, e64, axes)
    if normalised:
        return normalised
    got, exp = a64[bad], e64[bad]
    if bool((got == 0).all()) and bool((exp != 0).all()):
        return "your values are 0 where they should not be"
    if bool((exp == 0).all()):
        return "non-zero values where there should be 0"
    if a64.dim() >= 2 and a64.shape[-1] == a64.shape[-2] and a64.shape[-1] > 1:
        swapped = e64.transpose(-2, -1)
        if bool(((a64 - swapped).abs() <= 1e-6 + 1e-5 * swapped.abs()).all()):
            return "they are the right values with the last two axes swapped (a transpose?)"
    nonzero = exp != 0
    if bool(nonzero.sum() >= 2):
        ratio = got[nonzero] / exp[nonzero]
        mid = float(ratio.median())
        if abs(mid - 1.0) > 1e-3 and bool(((ratio - mid).abs() <= 1e-4 * abs(mid)).all()):
            if mid == -1.0 or abs(mid + 1.0) < 1e-4:
                return "every differing value has the wrong sign"
            factor = "" if hidden else f" ({mid:.4g})"
            return f"every differing value is off by the same factor{factor} (a scale?)"
    scale = float(e64.abs().max()) or 1.0
    rel = float((a64 - e64).abs().max()) / scale       # the error against the values' size
    if a64.dtype == torch.float64 and rel < 1e-5:
        return ("the differences are at float32 rounding level (about 1e-7 of the values): "
                "a float32 value or step inside float64 maths?")
    if got.numel() >= 2:
        offset = got - exp
        mid = float(offset.median())
        if abs(mid) > 1e-3 * scale and bool(((offset - mid).abs() <= 1e-5 * abs(mid)).all()):
            shift = "" if hidden else f" ({mid:.4g})"
            return f"every differing value is off by the same amount{shift} (a missing or extra term?)"
    if rel < 1e-2:
        return ("the values are close everywhere (within 1% of their size) but not within "
                "tolerance: an approximation, or a slightly different formula?")
    return ""


def describe_difference(actual: torch.Tensor, expected: torch.Tensor, bad: torch.Tensor,
                        axes=None, *, hidden: bool = False) -> str:
    """One sentence saying what differs where, e.g. "The differences are only at seq_q 0, 3
    (2 of 8); your values are 0 where they should not be." Never raises. It never says
    "expected": a hidden test's message must not read as if it showed expected values."""
    try:
        where = _where(bad, axes)
        what = "" if not actual.is_floating_point() else _pattern(
            actual.double(), expected.double(), bad, hidden=hidden, axes=axes)
        if not actual.is_floating_point():
            got_true = int((bad & actual.bool()).sum())
            got_false = int(bad.sum()) - got_true
            what = ", ".join(p for p in (
                f"{got_true} True that should be False" if got_true else "",
                f"{got_false} False that should be True" if got_false else "") if p) \
                if actual.dtype == torch.bool else ""
    except Exception:  # noqa: BLE001 - a description must never hide the failure itself
        return ""
    if bad.all() and bad.numel() > 1:
        where = "every element differs"
    elif where:
        where = "the differences are " + where
    parts = [p for p in (where, what) if p]
    if not parts:
        return ""
    text = "; ".join(parts)
    return " " + text[0].upper() + text[1:] + ("" if text.endswith("?") else ".")


def assert_close(actual, expected: torch.Tensor, *, tol, name: str = "output",
                 axes: Sequence[str] | None = None, hint: str = "") -> None:
    """Check ``actual`` against ``expected``: type, exact shape, dtype, finite, then values.

    Passes when ``|actual - expected| <= tol.atol + tol.rtol * |expected|`` everywhere.
    ``axes`` names the dimensions for shape messages; ``hint`` is a likely cause to add
    when the values differ.
    """
    if type(actual) is not torch.Tensor:
        got = "None" if actual is None else type(actual).__name__
        raise Mismatch(f"{name}: expected a tensor, got {got}")
    exp_shape, act_shape = tuple(expected.shape), tuple(actual.shape)
    if act_shape != exp_shape:
        msg = (f"{name}: expected shape {_axes_text(exp_shape, axes)}, got "
               f"{act_shape}{_shape_hint(act_shape, exp_shape, axes)}")
        raise Mismatch(msg)
    if actual.dtype != expected.dtype:
        raise Mismatch(
            f"{name}: expected dtype {expected.dtype}, got {actual.dtype} (keep the input's "
            "dtype: avoid hard-coded float32 tensors, .float() or torch.tensor(...) constants)"
        )
    if expected.dtype == torch.bool or not expected.is_floating_point():
        bad = actual != expected
        if bad.any():
            idx = tuple(int(i) for i in bad.nonzero()[0])
            words = describe_difference(actual, expected, bad, axes)
            raise Mismatch(
                f"{name}: {int(bad.sum())} of {bad.numel()} elements differ; first at index "
                f"{idx}: expected {expected[idx].item()}, got {actual[idx].item()}.{words}"
                + (f" Likely cause: {hint}" if hint else ""),
                f"{name}: {int(bad.sum())} of {bad.numel()} elements differ.{words}"
                + (f" Likely cause: {hint}" if hint else ""),
                hint=hint,
            )
        return
    finite = torch.isfinite(actual)
    if not finite.all():
        idx = tuple(int(i) for i in (~finite).nonzero()[0])
        kind = "NaN" if torch.isnan(actual[idx]) else "inf"
        cause = ("a row whose keys are all blocked gives NaN after softmax of all -inf; "
                 "such rows must give zero weights") if kind == "NaN" else "overflow"
        raise Mismatch(
            f"{name}: {int((~finite).sum())} non-finite values, first {kind} at index {idx} "
            f"(likely cause: {cause})",
            f"{name}: {int((~finite).sum())} non-finite values ({kind}; likely cause: {cause})",
        )
    a64, e64 = actual.double(), expected.double()
    err = (a64 - e64).abs()
    allowed = tol.atol + tol.rtol * e64.abs()
    bad = err > allowed
    if not bad.any():
        return
    flat = int((err - allowed).argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), exp_shape))
    n_bad, n = int(bad.sum()), bad.numel()
    at = f"index {idx}" + (f" ({', '.join(f'{a}={i}' for a, i in zip(axes, idx, strict=False))})"
                           if axes and len(axes) == len(idx) else "")
    cause = f" Likely cause: {hint}" if hint else ""
    public = (
        f"{name}: {n_bad} of {n} elements outside tolerance (atol={tol.atol:g}, "
        f"rtol={tol.rtol:g}); worst at {at}: expected {e64[idx].item():.6g}, got "
        f"{a64[idx].item():.6g} (error {err[idx].item():.3g}); max error "
        f"{err.max().item():.3g}.{describe_difference(actual, expected, bad, axes)}{cause}"
    )
    hidden = (f"{name}: {n_bad} of {n} elements outside tolerance."
              f"{describe_difference(actual, expected, bad, axes, hidden=True)}{cause}")
    raise Mismatch(public, hidden, hint=hint)


def assert_true(condition: bool, message: str, *, hidden: str | None = None) -> None:
    """A property check (e.g. rows sum to 1) with a teaching message."""
    if not condition:
        raise Mismatch(message, hidden)


# --------------------------------------------------------------------------- resources

MIB = 1 << 20


def assert_one_process(m, name: str) -> None:
    """``m`` (a ``student.measure`` result) was computed in the student's own worker alone:
    its figures are the call's."""
    assert_true(not m.other_processes,
                f"{name}: another process did part of the work, so what the call used could "
                "not be measured; do the computation in your function's own process")


def charged_memory(m, looks_for: float, limit: float) -> tuple[int, int, int]:
    """(bytes charged, bytes kept from the warm-up that are charged, bytes forgiven) of
    ``m`` (a ``student.measure`` result) in a test whose limit is ``limit`` bytes and that
    looks for something of ``looks_for`` bytes: the call's own peak above its inputs, plus
    what its warm-up left held beyond ``usage.warmup_allowance`` (a scratch buffer kept
    from the warm-up and reused by the call cannot hide what the test looks for)."""
    allowance = warmup_allowance(looks_for, limit)
    kept = max(0, getattr(m, "kept_bytes", 0) - allowance)
    return m.peak_bytes + kept, kept, allowance


def _kept_words(kept: int, allowance: int) -> str:
    if not kept:
        return ""
    return (f" (of which {kept / MIB:.1f} MB was left held by the warm-up call, beyond the "
            f"{allowance / MIB:.1f} MB forgiven: memory kept from one call and reused by "
            "the next is the call's)")


def _inputs_words(m) -> str:
    inputs = getattr(m, "inputs_bytes", 0)
    if not inputs:
        return ""
    return (f"; for scale, the inputs are {inputs / MIB:.1f} MB (a float64 copy of them: "
            f"{2 * inputs / MIB:.1f} MB)")


def assert_memory_within(m, budget, *, name: str, big_bytes: int = 0,
                         big_what: str = "") -> None:
    """``m`` (a ``student.measure`` result) held at most ``budget.memory_mb`` MiB above its
    inputs at its peak, memory kept from its warm-up counted beyond what the test forgives
    (``charged_memory``). ``big_bytes``/``big_what``: the smallest tensor the test looks
    for (e.g. the (Lq, Lk) score matrix), for the allowance and the message, which says
    only what one figure shows: as much was held, not which tensor it was."""
    assert_one_process(m, name)
    limit = budget.memory_mb * MIB
    peak, kept, allowance = charged_memory(m, big_bytes or 2 * limit, limit)
    if peak <= limit:
        return
    text = (f"{name}: peak memory {peak / MIB:.1f} MB above the inputs{_kept_words(kept, allowance)}, "
            f"over the budget of {budget.memory_mb:g} MB (measured by the grader, after a "
            "warm-up call on other inputs of the same shapes)")
    if big_bytes:
        size = "as much as" if peak >= 0.9 * big_bytes else "part of what"
        text += (f"; {big_what} alone is {big_bytes / MIB:.0f} MB: {size} it takes was held "
                 "at once (it, or something of its size)")
    text += _inputs_words(m)
    raise Mismatch(text + ". Keep only one block of it at a time.")


def assert_work_grows_within(small, large, budget, *, name: str, factor: int,
                             linear: str = "linear work",
                             quadratic: str = "quadratic work", size: str = "the length",
                             cause: str = "Something grows with the square of the length: "
                                          "an (L, L) product?") -> None:
    """The CPU time of ``large`` (input ``factor`` times larger) is at most
    ``budget.work_ratio`` times that of ``small`` (two ``student.measure`` results: the
    same kind of worker, so the machine's speed cancels out, and a cost per call only
    lowers the ratio). ``linear``/``quadratic``: what grows ``factor``x and ``factor**2``x,
    ``size``: what grew, ``cause``: the message's last sentence, for the test's lesson."""
    assert_one_process(small, name)
    assert_one_process(large, name)
    ratio = large.cpu_s / max(small.cpu_s, 1e-4)
    assert_true(
        ratio <= budget.work_ratio,
        f"{name}: {factor}x {size} took {ratio:.1f}x the CPU time ({small.cpu_s * 1e3:.0f} "
        f"ms -> {large.cpu_s * 1e3:.0f} ms, measured by the grader); {linear} would take "
        f"about {factor}x, {quadratic} up to {factor * factor}x (allowed: "
        f"{budget.work_ratio:g}x). {cause}")


def _growth_words(small: tuple, large: tuple, what: str) -> tuple[str, str]:
    """What the growth of a figure between two lengths shows, only as far as it shows it:
    (words, "quadratic" | "linear" | "shrank" | "")."""
    (n0, v0), (n1, v1) = small, large
    factor = n1 / n0
    if v0 <= 0:
        return "", ""
    grew = v1 / v0
    text = f"; it grew {grew:.1f}x for {factor:g}x the length"
    if grew >= 0.6 * factor * factor:
        return text + f" (as an ({what}, {what}) tensor grows: {factor * factor:g}x)", "quadratic"
    if grew < 0.8:
        return (f"; it shrank to {grew:.1f}x for {factor:g}x the length (what was held at "
                f"{what}={n0} was not at {what}={n1}: a path taken at some lengths only?)",
                "shrank")
    if grew <= 1.5 * factor:
        return (text + f" (no faster than the length, {factor:g}x: what was held does not "
                f"grow as an ({what}, {what}) tensor does, {factor * factor:g}x, but is of "
                "fixed size or in proportion to the length: a buffer, a library's first-call "
                "cost, copies of the inputs)", "linear")
    return text, ""


def assert_memory_series_within(series, budget, *, name: str, big=None) -> None:
    """``series``: [(length, ``student.measure`` result)], shortest first. The peak memory
    above the inputs at each length is at most ``budget.memory_mb`` MiB scaled in
    proportion to the length (the budget is for the longest): memory O(L) at every length
    measured, not only at the longest; memory kept from a warm-up counted beyond what the
    test forgives at that length (``charged_memory``). ``big(length)`` -> (bytes, words):
    the tensor the test looks for (e.g. the (L, L) score matrix), for the allowance and the
    message, which names it only where the figures show it (their growth, its size)."""
    for _, m in series:
        assert_one_process(m, name)
    longest = series[-1][0]
    limits = {n: budget.memory_mb * MIB * n / longest for n, _ in series}
    charged = {}
    for n, m in series:
        looks_for = big(n)[0] if big is not None else 2 * limits[n]
        charged[n] = charged_memory(m, looks_for, limits[n])
    figures = "; ".join(f"L={n}: {charged[n][0] / MIB:.1f} MB" for n, _ in series)
    for n, m in series:
        peak, kept, allowance = charged[n]
        if peak <= limits[n]:
            continue
        text = (f"{name}: peak memory above the inputs {figures} (measured by the grader in "
                f"a fresh worker each, after a warm-up call on other inputs of the same "
                f"shapes){_kept_words(kept, allowance)}; allowed at most "
                f"{limits[n] / MIB:.1f} MB at L={n} (O(L): {budget.memory_mb:g} MB at "
                f"L={longest})")
        shape = ""
        if len(series) > 1:
            words, shape = _growth_words((series[0][0], charged[series[0][0]][0]),
                                         (longest, charged[longest][0]), "L")
            text += words
        if big is not None:
            size, words = big(n)
            if peak >= 0.9 * size and shape in ("", "quadratic"):
                text += f"; at L={n}, {words} alone is {size / MIB:.0f} MB: as much was held"
            elif peak >= 0.9 * size:
                text += (f"; at L={n}, {words} alone is {size / MIB:.0f} MB: as much was "
                         "held there, though the figures do not grow as it does")
        text += _inputs_words(m)
        raise Mismatch(text + ". Keep only one block of it at a time.")


def assert_memory_grows_as(series, budget, *, name: str, elements, o_text: str,
                           big) -> None:
    """``series``: [(length, ``student.measure`` result)] at two lengths, shortest first;
    memory O(``o_text``), ``elements(length)`` elements of it at a length. Judged by how
    the peak above the inputs grows: from the shorter to the longer length it may rise by
    at most ``budget.memory_factor`` 8-byte numbers per element the O(...) adds (the budget
    in MB derived from the O(...) for the test's shapes, in float64, any dtype inside it),
    and at the shorter length hold at most as many per element it has (nothing of fixed
    size hides a growth there). Memory kept from a warm-up counts beyond what the test
    forgives (``charged_memory``). ``big(length)`` -> (bytes, words): the tensor the test
    looks for (the (L, L) score matrix). The message gives the one reason the figures show."""
    for _, m in series:
        assert_one_process(m, name)
    (n0, m0), (n1, m1) = series[0], series[-1]
    per = budget.memory_factor * 8
    limit0, limit1 = per * elements(n0), per * elements(n1)
    peak0, kept0, allow0 = charged_memory(m0, big(n0)[0], limit0)
    peak1, kept1, allow1 = charged_memory(m1, big(n1)[0], limit1)
    figures = (f"peak memory above the inputs L={n0}: {peak0 / MIB:.1f} MB, L={n1}: "
               f"{peak1 / MIB:.1f} MB (measured by the grader in a fresh worker each, after "
               "a warm-up call on other inputs of the same shapes)"
               f"{_kept_words(kept0, allow0) or _kept_words(kept1, allow1)}")
    grew, allowed_rise = peak1 - peak0, limit1 - limit0
    if grew > allowed_rise:
        (b0, words0), (b1, words1) = big(n0), big(n1)
        text = (f"{name}: {figures}: it rose by {grew / MIB:.1f} MB from L={n0} to L={n1}, "
                f"more than O({o_text}) allows for the {n1 - n0} positions more: "
                f"{allowed_rise / MIB:.1f} MB ({budget.memory_factor:g} float64 numbers "
                f"per element)")
        if grew >= 0.5 * (b1 - b0):
            text += (f"; {words1} alone is {(b1 - b0) / MIB:.0f} MB more than {words0}: "
                     "the memory grew as it does, with the square of the length")
        raise Mismatch(text + ". Hold only each query's window of keys (or one block of "
                       "queries and its keys) at a time.")
    if peak0 > limit0:
        raise Mismatch(
            f"{name}: {figures}: at L={n0} already over the {limit0 / MIB:.1f} MB that "
            f"O({o_text}) allows there ({budget.memory_factor:g} float64 numbers per "
            f"element), though it grew no faster than that to L={n1}: something of fixed "
            "size, held at every length (a buffer, a table, copies of the inputs)"
            f"{_inputs_words(m0)}.")


def assert_work_within_reference(m, ref, budget, *, name: str, at: str) -> None:
    """The CPU time of ``m`` is at most ``budget.reference_ratio`` times that of ``ref``,
    the course's reference on the same input measured in a worker like the student's,
    beside it (``student.measure(..., reference=True)``): the same machine, load and
    limits, and nothing the student's code does at another size moves the yardstick."""
    assert_one_process(m, name)
    ratio = m.cpu_s / max(ref.cpu_s, 1e-3)
    assert_true(
        ratio <= budget.reference_ratio,
        f"{name} at {at}: {m.cpu_s * 1e3:.0f} ms of CPU time, {ratio:.1f}x the "
        f"{ref.cpu_s * 1e3:.0f} ms of the course's reference on the same input, measured "
        f"beside it (allowed: {budget.reference_ratio:g}x): more work than the lesson's "
        "algorithm does on this input")
