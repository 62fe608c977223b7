"""Name the mistake behind a failed test, and pick the arrays worth a picture.

Runs in the trusted grading process, only for failed tests (``grader.engine.plugin`` calls
``examine`` from its report hook). The inputs are the test's recorded student calls
(``Session.calls``: each request with the plain values that came back, or the StudentError),
the exception the test failed with and its tolerance. Each catalogued mistake of the lab
(``grader.mistakes``) is tried in order; the first that reproduces what the student returned
gives the diagnosis ``"<name>: <hint>"``. Nothing here may break grading: any exception,
or running past the time budget, means "no diagnosis".

The pictures (public tests only) are 2-D slices, kept in this process and never serialised:
the student's attention weights beside the expected ones, or the student's positional
encoding table beside the expected one (``grader.outputs.html`` draws them).

Both need the references (``solutions/``) and the catalogue (``grader/mistakes/``), which only
the grader's own bundles hold; where they are missing (a student release) there is simply no
diagnosis and no picture.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import TYPE_CHECKING

import torch

from grader.engine.compare import Mismatch
from grader.engine.student import StudentError
from grader.sandbox import protocol

if TYPE_CHECKING:   # grader.mistakes is imported only when a diagnosis runs (see _context)
    from grader.mistakes import Context

# CPU seconds of this thread per failed test; past them the search stops without a
# diagnosis. CPU time, not the wall clock: on a loaded machine a wall-clock budget ran out
# before the mistake was reached, and the student got no diagnosis for the machine's load.
TIME_BUDGET_S = 3.0
PICTURE_MAX = 64             # rows and columns drawn at most


def diagnosable(exc: BaseException) -> bool:
    """Failures whose cause may be a catalogued mistake: a value check, an exception in the
    student's code, or a ValueError that did not come."""
    if isinstance(exc, Mismatch):
        return True
    if isinstance(exc, StudentError):
        return exc.kind == "exception"
    return isinstance(exc, AssertionError) and str(exc).startswith("expected a ")


def diagnose(lab: str, test: str, exc: BaseException, calls: list, tol,
             budget_s: float = TIME_BUDGET_S) -> str:
    """``"<name>: <hint>"`` of the one catalogued mistake the calls show, or ``""`` (also
    when they fit several, and when anything goes wrong: the diagnosis never breaks
    grading)."""
    try:
        ctx = _context(lab, test, exc, calls, tol)
        found = [] if ctx is None else _diagnose(ctx, budget_s)
        return found[0] if len(found) == 1 else ""
    except Exception:  # noqa: BLE001
        return ""


def _diagnose(ctx: Context, budget_s: float) -> list[str]:
    """The diagnoses of every catalogued mistake the calls fit, in the catalogue's order
    (within the budget). More than one: these calls cannot tell them apart."""
    from grader.mistakes import catalogue
    deadline = time.thread_time() + budget_s
    found = []
    with _one_thread():
        for mistake in catalogue(ctx.lab):
            if time.thread_time() > deadline:
                break
            try:
                if mistake.matches(ctx):
                    found.append(mistake.diagnosis)
            except Exception:  # noqa: BLE001 - a mistake that cannot judge these calls: no
                continue
    return found


def examine(*, lab: str, test: str, exc: BaseException, calls: list, tol,
            hidden: bool, budget=None) -> tuple[str, list]:
    """(diagnosis, pictures) for a failed test; never raises. Hidden tests get no pictures.
    ``budget`` (a resource test's rubric budget) asks for the curve of what was measured.
    The diagnosis is the one catalogued mistake the calls fit ("" if they fit several:
    ``examine_candidates`` gives them all)."""
    found, pics = examine_candidates(lab=lab, test=test, exc=exc, calls=calls, tol=tol,
                                     hidden=hidden, budget=budget)
    return (found[0] if len(found) == 1 else ""), pics


def examine_candidates(*, lab: str, test: str, exc: BaseException, calls: list, tol,
                       hidden: bool, budget=None) -> tuple[list[str], list]:
    """``examine``, with every catalogued mistake the calls fit (diagnoses, in the
    catalogue's order) in place of the one; never raises."""
    diagnosis, pics = [], []
    curve = None
    if not hidden and budget is not None:   # no reference needed: in a release too
        try:
            curve = (loss_picture(calls) if budget.cpu_s is not None
                     else resource_picture(calls, memory=budget.memory_mb is not None
                                                     or budget.memory_factor is not None))
        except Exception:  # noqa: BLE001
            curve = None
    try:
        with _one_thread():
            ctx = _context(lab, test, exc, calls, tol)     # shared: replays are memoised
            if ctx is not None and diagnosable(exc):
                try:
                    diagnosis = _diagnose(ctx, TIME_BUDGET_S)
                except Exception:  # noqa: BLE001 - never let feedback break grading
                    diagnosis = []
            if curve is not None:
                return diagnosis, [curve]
            sources = PICTURE_SOURCES.get(lab)
            if ctx is not None and sources and not hidden:
                try:
                    pics = _pictures(ctx, sources)
                except Exception:  # noqa: BLE001
                    pics = []
    except Exception:  # noqa: BLE001
        return [], [curve] if curve is not None else []
    return diagnosis, pics


@contextlib.contextmanager
def _one_thread():
    """The replays are many small ops: one intra-op thread is much faster for them (a
    thread pool's hand-offs cost more than the work, worse on a busy machine)."""
    saved = torch.get_num_threads()
    if saved != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if saved != 1:
            torch.set_num_threads(saved)


def _context(lab, test, exc, calls, tol) -> Context | None:
    # Imported here: grader.mistakes (variants of the reference solutions) is grader-only
    # material that a student release leaves out; without it there is simply no diagnosis.
    from grader.mistakes import Context
    own = [c for c in calls if getattr(c, "lab", None) == lab and isinstance(c.req, dict)
           and c.req.get("target")]
    if not own:
        return None
    return Context(lab=lab, test=test, exc=exc, calls=_smallest_measured(own), tol=tol)


def _input_size(call) -> int:
    return sum(t.numel() for t in protocol.flat_tensors(
        [call.req.get("args", []), list(call.req.get("kwargs", {}).values())]))


def _smallest_measured(calls: list) -> list:
    """The calls, with a resource test's measured calls cut to the smallest of each target:
    they are large on purpose (L = 8192), and replaying every mistake on them would spend
    the diagnosis's time budget; the smallest shows the same mistake."""
    smallest: dict[str, object] = {}
    for c in calls:
        if getattr(c, "used", None) is not None:
            best = smallest.get(c.req["target"])
            if best is None or _input_size(c) < _input_size(best):
                smallest[c.req["target"]] = c
    keep = {id(c) for c in smallest.values()}
    return [c for c in calls if getattr(c, "used", None) is None or id(c) in keep]


# --------------------------------------------------------------------------------------------
# pictures
# --------------------------------------------------------------------------------------------


def _attention_pair(call, expected):
    """(student weights, expected weights) of an attention call, or None."""
    got, exp = call.value, expected.value
    if not (isinstance(got, (tuple, list)) and isinstance(exp, (tuple, list))
            and len(got) == 2 and len(exp) == 2):
        return None
    return got[1], exp[1]


def _positional_pair(call, expected):
    req = call.req
    got, exp = call.value, expected.value
    if req.get("op") == "buffer" and req.get("name") == "pe":
        return got, exp
    if req.get("op") == "call" and req.get("ctor") is None:
        return got, exp
    if req.get("op") == "call" and req.get("args"):
        # x + pe[:seq]: the student's table is the output minus the input (first batch row)
        x = req["args"][0]
        if (isinstance(got, torch.Tensor) and isinstance(exp, torch.Tensor)
                and isinstance(x, torch.Tensor) and got.shape == x.shape and got.dim() == 3):
            return ((got - x.to(got.dtype))[0], (exp - x.to(exp.dtype))[0],
                    " (the module's output minus its input, batch 0)")
    return None


PICTURE_SOURCES = {
    # lab: {target: (kind, pair(call, expected) -> (student, expected) | None, axis labels)}
    "lab1_attention": {"scaled_dot_product_attention": ("attention", _attention_pair, ("query", "key"))},
    "lab2_multihead": {"MultiHeadAttention": ("attention", _attention_pair, ("query", "key"))},
    "lab3_positional": {"sinusoidal_positional_encoding": ("positional", _positional_pair,
                                                           ("position", "feature")),
                        "SinusoidalPositionalEncoding": ("positional", _positional_pair,
                                                         ("position", "feature"))},
}

LEADING_NAMES = {2: (), 3: ("batch",), 4: ("batch", "head")}


def pictures(lab: str, test: str, exc: BaseException, calls: list, tol) -> list[dict]:
    """At most one picture for a failed test: the recorded call whose attention weights (or
    positional table) differ most from the reference's, as 2-D slices."""
    sources = PICTURE_SOURCES.get(lab)
    ctx = _context(lab, test, exc, calls, tol) if sources else None
    if ctx is None:
        return []
    with _one_thread():
        return _pictures(ctx, sources)


def _pictures(ctx: Context, sources: dict) -> list[dict]:
    from grader.mistakes import close
    best, best_err = None, -1.0
    for call in ctx.calls:
        source = sources.get(call.req.get("target"))
        if source is None or call.error is not None or call.req.get("op") not in ("call", "buffer"):
            continue
        expected = ctx.reference(call)
        if not expected.ok:
            continue
        kind, pair_of, labels = source
        pair = pair_of(call, expected)
        if pair is None:
            continue
        got, exp, note = (*pair, "")[:3]
        if type(got) is not torch.Tensor or type(exp) is not torch.Tensor or exp.dim() < 2:
            continue
        if not got.is_floating_point() or not exp.is_floating_point():
            continue
        if (got.shape == exp.shape and close(got, exp, ctx.tol)) or ctx.is_random(call):
            continue            # nothing to see, or a random answer (training dropout)
        picture = _slice_picture(kind, labels, got, exp)
        if picture is not None:
            picture["title"] += note
        if picture is not None and picture["error"] > best_err:
            best, best_err = picture, picture["error"]
    if best is None:
        return []
    best.pop("error")
    return [best]


def resource_picture(calls: list, *, memory: bool) -> dict | None:
    """A curve of what the student's measured calls used against their length (the second
    to last axis of the first tensor argument): their peak memory beside what a whole
    (L, L) float32 matrix takes (``memory``), or their CPU time beside linear growth from
    the shortest call."""
    points = []
    for call in calls:
        used = getattr(call, "used", None)
        args = call.req.get("args") if isinstance(getattr(call, "req", None), dict) else None
        if used is None or not args or not isinstance(args[0], torch.Tensor) \
                or args[0].dim() < 2:
            continue
        points.append((int(args[0].shape[-2]), used.peak_bytes / 2**20, used.cpu_s * 1e3))
    lengths = sorted({p[0] for p in points})
    if not lengths:
        return None
    # The smallest figure for each length (repeats measure the same call again).
    mem = [min(p[1] for p in points if p[0] == n) for n in lengths]
    cpu = [min(p[2] for p in points if p[0] == n) for n in lengths]
    if not memory:
        return {"kind": "resource", "title": "CPU time of your calls against the length",
                "x": lengths, "yours": cpu, "unit": "ms", "x_label": "length L",
                "reference": [cpu[0] * n / lengths[0] for n in lengths],
                "reference_label": "linear growth from your shortest call"}
    return {"kind": "resource", "title": "peak memory of your calls above their inputs",
            "x": lengths, "yours": mem, "unit": "MB", "x_label": "length L",
            "reference": [n * n * 4 / 2**20 for n in lengths],
            "reference_label": "one whole (L, L) float32 matrix"}


LOSS_POINTS = 200           # steps drawn at most (a long history is thinned evenly)


def loss_picture(calls: list) -> dict | None:
    """The training loss curve of a recorded train call (lab 8's optional
    ``model.loss_history``: plain floats from the worker), beside chance (ln 13 nats per
    token, a model that has learnt nothing); None without a history."""
    for call in calls:
        req, value = getattr(call, "req", None), getattr(call, "value", None)
        if not (isinstance(req, dict) and req.get("op") == protocol.TRAIN
                and isinstance(value, dict)):
            continue
        history = value.get("loss_history")
        if not isinstance(history, list) or not history:
            return None
        stride = max(1, -(-len(history) // LOSS_POINTS))
        steps = list(range(1, len(history) + 1, stride))
        losses = [float(history[i - 1]) for i in steps]
        return {"kind": "resource", "title": "your training loss (model.loss_history)",
                "x": steps, "yours": losses, "unit": "loss (nats per token)",
                "x_label": "step", "reference": [math.log(13)] * len(steps),
                "reference_label": "chance: ln 13, a model that learnt nothing"}
    return None


def _slice_picture(kind, labels, got, exp) -> dict | None:
    got, exp = got.detach().double(), exp.detach().double()
    what = "attention weights" if kind == "attention" else "positional encoding"
    if got.shape == exp.shape:
        err = (got - exp).abs().nan_to_num(nan=float("inf"))
        worst = float(err.max()) if err.numel() else 0.0
        if worst == 0.0:
            return None
        rows, cols = exp.shape[-2:]
        flat_err = err.reshape(-1, rows, cols).amax(dim=(1, 2))
        k = int(flat_err.argmax())
        lead = tuple(int(i) for i in torch.unravel_index(torch.tensor(k), exp.shape[:-2])) \
            if exp.dim() > 2 else ()
        s, e = got.reshape(-1, rows, cols)[k], exp.reshape(-1, rows, cols)[k]
        diff = s - e
        shape_note = ""
    else:
        # Different shapes: the first slice of each, side by side, no difference.
        if got.dim() < 2:
            return None
        s = got.reshape(-1, *got.shape[-2:])[0]
        e = exp.reshape(-1, *exp.shape[-2:])[0]
        lead, diff, worst = (0,) * (exp.dim() - 2), None, float("inf")
        shape_note = f" (your shape {tuple(got.shape)}, expected {tuple(exp.shape)})"
    names = LEADING_NAMES.get(exp.dim(), tuple(f"dim{i}" for i in range(exp.dim() - 2)))
    where = ", ".join(f"{n} {i}" for n, i in zip(names, lead, strict=False))
    cropped = any(n > PICTURE_MAX for n in (*s.shape, *e.shape))
    title = (what + (f" [{where}]" if where else "") + shape_note
             + (f" (first {PICTURE_MAX} rows and columns)" if cropped else ""))

    def crop(t):
        return None if t is None else t[:PICTURE_MAX, :PICTURE_MAX].clone()

    return {"kind": kind, "title": title, "student": crop(s), "expected": crop(e),
            "difference": crop(diff), "rows": labels[0], "cols": labels[1], "error": worst}
