"""The catalogue of classic mistakes, one module per lab, and the machinery to recognise them.

A *mistake* is a small wrong implementation that the trusted grader can run: a variant of the
reference solution (``solutions/``, loaded with ``grader.engine.reference.load_reference``) with one
classic error in it, or, for mistakes that show as behaviour rather than values, a small rule.
When a test fails, ``grader.diagnose`` replays the test's recorded student calls through every
catalogued mistake of the lab; a mistake that reproduces what the *student* returned, on every
call, names the student's error.

Everything here runs in the trusted grading process on plain tensors that came back from the
worker; no student code is ever imported or run here.

Building blocks (used by the per-lab modules ``grader.mistakes.lab*``):

- ``Impl``: a way to answer a request: the reference module, with some of its functions or
  classes replaced by wrong ones.
- ``replay(impl, req)``: answer a recorded request the way the worker would: with the same
  code, ``grader.sandbox.protocol.answer`` (ops ``call``, ``grad``, ``state_dict``, ``buffer``).
- ``Replay``: a mistake given as one or more ``Impl`` variants; it matches when one variant
  reproduces the student's reply on every recorded call and differs from the reference on at
  least one (calls whose result is random, e.g. training dropout, count as no evidence).
- ``DropoutStats``: dropout mistakes, compared by statistics (fraction of zeros, scale of
  the survivors) since a student's use of the RNG may differ from ours.
- ``Rule``: a behavioural mistake given as a predicate over the recorded calls.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
from dataclasses import dataclass, field
from typing import Callable

import torch

from grader.engine.memo import ValueCache, copy_value, value_key
from grader.rubric import Tolerance
from grader.sandbox import protocol

__all__ = ["Context", "DropoutPlacement", "DropoutSite", "DropoutStats", "Impl", "Mistake",
           "Replay", "Rule", "catalogue", "close", "replay", "LABS"]

LABS = ("lab1_attention", "lab2_multihead", "lab3_positional", "lab4_transformer_block",
        "lab5_decoder", "lab6_efficient_attention", "lab7_relative_positions",
        "lab8_train_transformer")


class ReplayError(Exception):
    """The trusted replay itself failed (a request it cannot answer)."""


# --------------------------------------------------------------------------------------------
# implementations and replay
# --------------------------------------------------------------------------------------------


class Impl:
    """The reference solution of ``lab`` with some names (functions, classes) replaced."""

    def __init__(self, lab: str, overrides: dict | None = None):
        self.lab = lab
        self.overrides = dict(overrides or {})

    @property
    def reference(self):
        from grader.engine.reference import load_reference
        return load_reference(self.lab)

    def resolve(self, target: str):
        if target in self.overrides:
            return self.overrides[target]
        return getattr(self.reference, target, None)

    def key(self) -> tuple:
        return (self.lab, tuple(sorted((k, id(v)) for k, v in self.overrides.items())))


@dataclass
class Result:
    """A replayed answer: a value, or the exception the implementation raised."""
    value: object = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def replay(impl: Impl, req: dict) -> Result:
    """Answer ``req`` with ``impl`` exactly as the sandbox worker answers it with student code:
    with the same code (``protocol.answer``), on copies of the request's tensors (as the
    worker gets them; recorded requests are replayed again and again, and a mistake may
    change its inputs in place)."""
    if req.get("op") not in protocol.OPS:
        raise ReplayError(f"cannot replay op {req.get('op')!r}")
    # Grad mode on, as in the worker: PyTorch modules take other code paths under no_grad
    # (nn.MultiheadAttention's fast path gives NaN where the slow path gives numbers).
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        try:
            return Result(value=protocol.answer(impl.resolve, protocol.plain(req), impl.lab))
        except Exception as exc:  # noqa: BLE001 - the implementation's own error is an answer
            return Result(error=exc)


_REPLAYS = ValueCache(name="grader.mistakes.replays")


def cached_replay(impl: Impl, req: dict) -> Result:
    """``replay``, computed once per process for each implementation and request.

    The suites' requests are the same for every submission (seeded inputs), so a class
    that makes the same mistake asks for the same replays again and again.
    """
    try:
        key = (impl.key(), value_key(req))
    except TypeError:
        return replay(impl, req)
    # The entry keeps ``impl`` alive: the ids in its key cannot be reused while it exists.
    _, result = _REPLAYS.get_or_compute(key, lambda: (impl, replay(impl, req)))
    return Result(value=copy_value(result.value), error=result.error)


def bind(fn, args, kwargs) -> dict:
    """The arguments of a call by parameter name, defaults included."""
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


# --------------------------------------------------------------------------------------------
# comparison
# --------------------------------------------------------------------------------------------


def close(a, b, tol) -> bool:
    """``a`` reproduces ``b``: same structure, shapes and dtypes; values within ``tol`` of ``b``
    (``|a - b| <= atol + rtol * |b|``); NaN and inf in the same places."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (type(a) is torch.Tensor and type(b) is torch.Tensor):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if not a.is_floating_point():
            return bool(torch.equal(a, b))
        a64, b64 = a.double(), b.double()
        fa, fb = torch.isfinite(a64), torch.isfinite(b64)
        if not torch.equal(fa, fb):
            return False
        if not fa.all():
            na, nb = torch.isnan(a64), torch.isnan(b64)
            if not torch.equal(na, nb):
                return False
            inf = ~fa & ~na
            if not torch.equal(a64[inf], b64[inf]):
                return False
        err = (a64[fa] - b64[fa]).abs()
        return bool((err <= tol.atol + tol.rtol * b64[fa].abs()).all())
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b, strict=False))
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(close(a[k], b[k], tol) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=tol.rtol, abs_tol=tol.atol) or a == b
    if type(a) is not type(b):
        return False
    return a == b


# What a crash says about its cause, by the words torch and Python use: two crashes of one
# kind are the same mistake's only if they fall in the same one (a join on the wrong axis and
# a mask of the wrong width both refuse sizes, in different words).
CRASH_KINDS = (
    ("join", re.compile(r"[Ss]izes? of tensors must match except in dimension|"
                        r"torch\.cat|Tensors must have same number of dimensions")),
    ("broadcast", re.compile(r"size of tensor a \(\d+\) must match the size of tensor b|"
                             r"shape mismatch|not broadcastable|cannot broadcast")),
    ("matmul", re.compile(r"cannot be multiplied|mat\d? and mat\d? shapes|"
                          r"Expected size for first two dimensions of batch2")),
    ("view", re.compile(r"shape '\[.*\]' is invalid for input of size|view size is not")),
    ("index", re.compile(r"index out of range|out of bounds|IndexError")),
)


def crash_kind(type_name: str, message: str) -> str:
    """``type_name`` and the first CRASH_KINDS entry ``message`` falls in ("" for none)."""
    kind = next((name for name, words in CRASH_KINDS if words.search(message or "")), "")
    return f"{type_name}:{kind}"


def same_answer(student, result: Result, tol) -> bool:
    """The student's recorded answer (value or StudentError) agrees with a replayed one. Two
    crashes agree only when they are the same crash: the same exception type, and the same
    kind of complaint where the message says one (``crash_kind``): a mistake that crashes is
    named only for the crash it causes."""
    if student.error is not None or not result.ok:
        if not (student.error is not None and not result.ok
                and student.error.kind == "exception"):
            return False
        return (crash_kind(student.error.type_name, student.error.message)
                == crash_kind(type(result.error).__name__, str(result.error)))
    return close(student.value, result.value, tol)


def agree(a: Result, b: Result, tol) -> bool:
    """Two replayed answers agree: both raised, or both returned close values."""
    if not a.ok or not b.ok:
        return not a.ok and not b.ok
    return close(a.value, b.value, tol)


# --------------------------------------------------------------------------------------------
# the context of one failed test
# --------------------------------------------------------------------------------------------


@dataclass
class Context:
    """One failed test: its recorded calls, the exception it failed with, its tolerance."""
    lab: str
    test: str
    exc: BaseException
    calls: list                    # grader.engine.student.RecordedCall (those with a target)
    tol: object                    # grader.rubric.Tolerance
    _memo: dict = field(default_factory=dict)

    def run(self, impl: Impl, call, req: dict | None = None, tag: str = "") -> Result:
        """``impl``'s answer to ``call`` (or to ``req``, a variant of it), memoised."""
        key = (impl.key(), id(call), tag)
        if key not in self._memo:
            self._memo[key] = cached_replay(impl, req if req is not None else call.req)
        return self._memo[key]

    def reference(self, call) -> Result:
        return self.run(Impl(self.lab), call)

    def is_random(self, call) -> bool:
        """The reference's answer depends on the seed (e.g. dropout in training)."""
        other = dict(call.req, seed=int(call.req.get("seed", 0)) + 7919)
        a, b = self.reference(call), self.run(Impl(self.lab), call, other, tag="reseeded")
        return not agree(a, b, self.tol)

    def matches_reference(self, call) -> bool:
        return same_answer(call, self.reference(call), self.tol)

    @property
    def evidence_first(self) -> list:
        """The calls, those where the student differs from the reference first: a wrong
        guess then fails on its first replay."""
        if "_ordered" not in self._memo:
            self._memo["_ordered"] = sorted(self.calls, key=self.matches_reference)
        return self._memo["_ordered"]


# --------------------------------------------------------------------------------------------
# mistakes
# --------------------------------------------------------------------------------------------


@dataclass
class Mistake:
    """A named classic mistake with a hint that teaches the fix."""
    id: str
    name: str
    hint: str

    @property
    def diagnosis(self) -> str:
        return f"{self.name}: {self.hint}"

    def matches(self, ctx: Context) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass
class Replay(Mistake):
    """A mistake given as wrong implementations (``variants``: one Impl each)."""
    variants: list = field(default_factory=list)

    def matches(self, ctx: Context) -> bool:
        return any(self._variant_matches(v, ctx) for v in self.variants)

    def _variant_matches(self, impl: Impl, ctx: Context) -> bool:
        active = False
        for call in ctx.evidence_first:
            guess = ctx.run(impl, call)
            if not same_answer(call, guess, ctx.tol):
                if ctx.is_random(call):
                    continue            # a random answer (dropout): no evidence either way
                return False
            if not agree(ctx.reference(call), guess, ctx.tol):
                active = True
        return active


@dataclass
class DropoutSite:
    """Where dropout acts in one call: its probability, whether the call trains, the same
    request without dropout (``clean_req``) and how to pick the dropped tensor from a reply."""
    p: float
    training: bool
    clean_req: dict
    component: Callable


@dataclass
class DropoutStats(Mistake):
    """Dropout done wrong, recognised by statistics rather than exact values.

    ``mode`` is ``"eval"`` (dropout also when not training) or ``"no_rescale"`` (survivors not
    scaled by 1/(1-p)). ``site(req)`` gives the call's DropoutSite, or None where the target has
    no dropout. A call with no dropout to do must match the reference exactly.
    """
    mode: str = "eval"
    site: Callable = None

    def predicted(self, s: DropoutSite) -> tuple[float, float]:
        if self.mode == "eval":
            return s.p, 1.0 / (1.0 - s.p)
        return (s.p, 1.0) if s.training else (0.0, 1.0)

    def matches(self, ctx: Context) -> bool:
        active = False
        for call in ctx.evidence_first:
            s = self.site(call.req)
            if s is None or s.p <= 0.0 or s.p >= 1.0:
                if not ctx.matches_reference(call) and not ctx.is_random(call):
                    return False
                continue
            if call.error is not None:
                return False
            clean = ctx.run(Impl(ctx.lab), call, s.clean_req, tag="clean")
            if not clean.ok:
                return False
            p, scale = self.predicted(s)
            ref = (s.p, 1.0 / (1.0 - s.p)) if s.training else (0.0, 1.0)
            if p == 0.0:
                ok = close(call.value, clean.value, ctx.tol)
            else:
                try:
                    ok = dropout_consistent(s.component(call.value), s.component(clean.value),
                                            p, scale, ctx.tol)
                except (TypeError, IndexError, KeyError):
                    ok = False
            if not ok:
                return False
            if (p, scale) != ref:
                active = True
        return active


@dataclass
class DropoutPlacement(Mistake):
    """Dropout missing from the returned tensor it belongs to, recognised by exact values.

    In a training call with dropout, the returned component (``site.component``: the
    attention weights) is exactly the reference's *without* dropout. ``mode`` says what the
    rest of the reply shows: ``"output_only"``, dropout acted elsewhere (the output uses
    dropped weights; the weights returned are from before it); ``"none"``, no dropout at all
    (the whole reply is the dropout-free one). Calls without dropout to do must match the
    reference.
    """
    mode: str = "output_only"
    site: Callable = None

    def matches(self, ctx: Context) -> bool:
        active = False
        for call in ctx.evidence_first:
            s = self.site(call.req)
            if s is None or not s.training or s.p <= 0.0 or s.p >= 1.0:
                if not ctx.matches_reference(call) and not ctx.is_random(call):
                    return False
                continue
            if call.error is not None:
                return False
            clean = ctx.run(Impl(ctx.lab), call, s.clean_req, tag="clean")
            if not clean.ok:
                return False
            try:
                unchanged = close(s.component(call.value), s.component(clean.value), ctx.tol)
            except (TypeError, IndexError, KeyError):
                return False
            if not unchanged:
                return False
            if close(call.value, clean.value, ctx.tol) != (self.mode == "none"):
                return False
            active = True
        return active


def dropout_consistent(got, clean, p: float, scale: float, tol) -> bool:
    """``got`` looks like dropout(p) of ``clean`` with survivors scaled by ``scale``."""
    if type(got) is not torch.Tensor or type(clean) is not torch.Tensor or got.shape != clean.shape:
        return False
    g, c = got.double(), clean.double()
    live = c != 0                                   # positions dropout could have zeroed
    n = int(live.sum())
    if n == 0 or not torch.isfinite(g).all() or bool((g[~live] != 0).any()):
        return False
    dropped = (g == 0) & live
    frac = float(dropped.sum()) / n
    band = max(0.05, 4.0 * math.sqrt(p * (1.0 - p) / n))
    if abs(frac - p) > band:
        return False
    kept = live & ~dropped
    expected = c[kept] * scale
    return bool(((g[kept] - expected).abs() <= tol.atol + tol.rtol * expected.abs()).all())


@dataclass
class Rule(Mistake):
    """A behavioural mistake: ``predicate(ctx)`` says whether the recorded calls show it."""
    predicate: Callable = None

    def matches(self, ctx: Context) -> bool:
        return bool(self.predicate(ctx))


# --------------------------------------------------------------------------------------------
# rules shared by every lab
# --------------------------------------------------------------------------------------------

_DTYPE_ERROR = re.compile(r"dtype|Double|Float|scalar type|same type", re.IGNORECASE)


def _has_float64(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dtype == torch.float64
    if isinstance(value, (list, tuple)):
        return any(_has_float64(v) for v in value)
    if isinstance(value, dict):
        return any(_has_float64(v) for v in value.values())
    return False


def _narrowed(got, ref) -> bool:
    """Somewhere the reference answers float64, the student answered float32."""
    if isinstance(ref, torch.Tensor):
        return (isinstance(got, torch.Tensor) and ref.dtype == torch.float64
                and got.dtype == torch.float32)
    if isinstance(ref, (list, tuple)) and isinstance(got, (list, tuple)):
        return any(_narrowed(g, r) for g, r in zip(got, ref, strict=False))
    if isinstance(ref, dict) and isinstance(got, dict):
        return any(_narrowed(got[k], ref[k]) for k in ref if k in got)
    return False


def float64_narrowed(ctx: Context) -> bool:
    for call in ctx.calls:
        req = call.req
        if not (req.get("dtype") == "float64" or _has_float64(req.get("args"))
                or _has_float64(req.get("kwargs"))):
            continue
        ref = ctx.reference(call)
        if not ref.ok:
            continue
        if call.error is not None:
            if call.error.kind == "exception" and _DTYPE_ERROR.search(call.error.message or ""):
                return True
        elif _narrowed(call.value, ref.value):
            return True
    return False


def gradients_detached(ctx: Context) -> bool:
    """A gradient call whose forward output is right but whose input gradients are missing,
    zero or wrong (its hint says the forward values are right: it must be true)."""
    for call in ctx.calls:
        if call.req.get("op") != "grad":
            continue
        if call.error is not None:
            if call.error.type_name == "GradientError" or "does not depend on the inputs" in (
                    call.error.message or ""):
                return True
            continue
        ref = ctx.reference(call)
        if not ref.ok or not isinstance(call.value, dict):
            continue
        got, exp = call.value, ref.value
        if not close(got.get("output"), exp["output"], ctx.tol):
            continue                    # the forward is wrong too: a mistake of its own
        s_in, r_in = tuple(got.get("input_grads") or ()), tuple(exp["input_grads"])
        if len(s_in) != len(r_in):
            continue
        for s, r in zip(s_in, r_in, strict=False):
            if r is not None and bool((r != 0).any()) and (
                    s is None or (isinstance(s, torch.Tensor) and bool((s == 0).all()))):
                return True
        # Forward and parameter gradients right, finite input gradients wrong: some path
        # from the inputs was cut off from autograd (.detach(), .data, no_grad, numpy).
        if (close(got.get("param_grads"), exp["param_grads"], ctx.tol)
                and all(isinstance(s, torch.Tensor) and bool(torch.isfinite(s).all())
                        for s, r in zip(s_in, r_in, strict=False) if r is not None)
                and not close(list(s_in), list(r_in), ctx.tol)):
            return True
    return False


# float32 precision: what float32 rounding leaves of a float64 result (float32's epsilon is
# 1.2e-7; a few roundings through a softmax, a matmul or a LayerNorm stay well inside this)
FLOAT32_LEVEL = Tolerance(atol=1e-6, rtol=1e-5)


def float32_precision(ctx: Context) -> bool:
    """float64 in, float64 out, but only float32-precise (a float32 constant or an
    intermediate step in float32); every other call is right."""
    active = False
    for call in ctx.evidence_first:
        if ctx.matches_reference(call):
            continue
        if ctx.is_random(call) or call.error is not None:
            return False
        req = call.req
        if not (req.get("dtype") == "float64" or _has_float64(req.get("args"))
                or _has_float64(req.get("kwargs"))):
            return False
        ref = ctx.reference(call)
        if not ref.ok or not _has_float64(ref.value):
            return False
        if not close(call.value, ref.value, FLOAT32_LEVEL):
            return False
        active = True
    return active


FLOAT32_CAST = Rule(
    id="float32_cast", name="float64 inputs returned as float32",
    hint="something casts to float32 (.float(), torch.tensor(...) or torch.zeros(...) without "
         "dtype=, a float32 constant); keep the input's dtype (x.dtype, torch.zeros_like, "
         "torch.ones(..., dtype=x.dtype)) so float64 in gives float64 out",
    predicate=float64_narrowed)

FLOAT32_PRECISION = Rule(
    id="float32_precision", name="float64 results only float32-precise",
    hint="the dtype is float64, but somewhere a float32 value enters the maths (a constant "
         "such as torch.sqrt(torch.FloatTensor([d_k])) or torch.tensor(x) made without dtype=, "
         "or a step done in float32), so float64 results carry float32 rounding errors "
         "(about 1e-7); use Python floats (math.sqrt(d_k)) or tensors made with the input's "
         "dtype",
    predicate=float32_precision)

DETACHED = Rule(
    id="detached_gradients", name="detached gradients",
    hint="the forward values are right but gradients do not flow back to the inputs: something "
         "on the path from an input was detached (.detach(), .data, torch.no_grad(), .item(), "
         "numpy); keep every step of the computation in torch on the original tensors",
    predicate=gradients_detached)


# --------------------------------------------------------------------------------------------
# the catalogue
# --------------------------------------------------------------------------------------------


_catalogues: dict[str, list[Mistake]] = {}


def catalogue(lab: str) -> list[Mistake]:
    """The lab's mistakes, in the order they are tried (the first that matches is named)."""
    if lab not in LABS:
        return []
    if lab not in _catalogues:
        module = importlib.import_module(f"grader.mistakes.{lab}")
        _catalogues[lab] = list(module.mistakes())
    return _catalogues[lab]


def all_mistakes() -> dict[str, Mistake]:
    """Every catalogued mistake by id (a mistake shared by labs appears once)."""
    out: dict[str, Mistake] = {}
    for lab in LABS:
        for m in catalogue(lab):
            out.setdefault(m.id, m)
    return out
