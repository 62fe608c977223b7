"""Tolerance checks whose failure messages teach.

All comparisons run in the trusted process on plain tensors rebuilt from bytes. A failure
raises ``Mismatch``, an AssertionError carrying two messages: the full one for public tests
(expected, got, worst element, likely cause) and one for hidden tests that keeps the cause
but no values, which would make feedback an oracle for the hidden expected outputs.
"""

from __future__ import annotations

from typing import Sequence

import torch


class Mismatch(AssertionError):
    """A check failed. ``str()`` is the public message; ``hidden`` the value-free one."""

    def __init__(self, public: str, hidden: str | None = None):
        super().__init__(public)
        self.public = public
        self.hidden = hidden if hidden is not None else public


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
            raise Mismatch(
                f"{name}: {int(bad.sum())} of {bad.numel()} elements differ; first at index "
                f"{idx}: expected {expected[idx].item()}, got {actual[idx].item()}"
                + (f". Likely cause: {hint}" if hint else ""),
                f"{name}: {int(bad.sum())} of {bad.numel()} elements differ"
                + (f". Likely cause: {hint}" if hint else ""),
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
        f"{err.max().item():.3g}.{cause}"
    )
    hidden = f"{name}: {n_bad} of {n} elements outside tolerance.{cause}"
    raise Mismatch(public, hidden)


def assert_true(condition: bool, message: str, *, hidden: str | None = None) -> None:
    """A property check (e.g. rows sum to 1) with a teaching message."""
    if not condition:
        raise Mismatch(message, hidden)
