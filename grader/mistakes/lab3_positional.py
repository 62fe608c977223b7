"""Lab 3 mistakes: the sinusoidal table, the positional modules and their max_len check.

``table`` is the reference ``sinusoidal_positional_encoding`` (float64 inside, float32 out)
with switches for the classic formula mistakes; the wrong ``SinusoidalPositionalEncoding``
subclasses the reference and registers the wrong table as its ``pe`` buffer. The mistakes
that show as behaviour (an odd d_model crashing, no ValueError past max_len) are rules.
"""

from __future__ import annotations

import functools
import re

import torch

from grader.mistakes import DETACHED, FLOAT32_CAST, FLOAT32_PRECISION, Impl, Replay, Rule, bind

LAB = "lab3_positional"
FUNCTION = "sinusoidal_positional_encoding"
SINUSOIDAL = "SinusoidalPositionalEncoding"
LEARNED = "LearnedPositionalEmbedding"


def table(seq_len, d_model, base=10000.0, *, swap=False, pair_exponent=False):
    """The reference table; swap: cos in the even columns, sin in the odd ones;
    pair_exponent: frequency base**(-i/d_model) for pair i instead of base**(-2i/d_model)."""
    position = torch.arange(seq_len, dtype=torch.float64).unsqueeze(1)
    if pair_exponent:
        exponent = torch.arange(0, (d_model + 1) // 2, dtype=torch.float64)
    else:
        exponent = torch.arange(0, d_model, 2, dtype=torch.float64)
    angles = position * torch.pow(base, -exponent / d_model).unsqueeze(0)
    pe = torch.zeros(seq_len, d_model, dtype=torch.float64)
    even, odd = (torch.cos, torch.sin) if swap else (torch.sin, torch.cos)
    pe[:, 0::2] = even(angles)
    pe[:, 1::2] = odd(angles[:, : d_model // 2])
    return pe.to(torch.float32)


def sinusoidal_class(base_cls, make_table):
    class WrongSinusoidalPositionalEncoding(base_cls):
        def __init__(self, d_model, max_len=5000, dropout=0.0):
            super().__init__(d_model, max_len, dropout)
            self.pe = make_table(max_len, d_model)   # replaces the registered buffer

    return WrongSinusoidalPositionalEncoding


def _d_model(req: dict, ref) -> int | None:
    """The d_model of a table or sinusoidal-module request, or None."""
    try:
        if req.get("target") == FUNCTION and req.get("ctor") is None:
            return int(bind(ref.sinusoidal_positional_encoding, req["args"], req["kwargs"])["d_model"])
        if req.get("target") == SINUSOIDAL and req.get("ctor") is not None:
            ctor = req["ctor"]
            return int(bind(ref.SinusoidalPositionalEncoding.__init__, [None, *ctor["args"]],
                            ctor["kwargs"])["d_model"])
    except (TypeError, ValueError, KeyError):
        return None
    return None


# What a slice or an assignment of the wrong width says (not any exception at all: code that
# fails for every d_model is not an odd-d_model mistake).
_SIZE_ERROR = re.compile(r"size|shape|dimension|match|broadcast|out of (range|bounds)",
                         re.IGNORECASE)


def odd_d_model_fails(ctx) -> bool:
    """A request with an odd d_model raises or gives the wrong shape; the reference copes."""
    ref = Impl(LAB).reference
    for call in ctx.calls:
        d = _d_model(call.req, ref)
        if d is None or d % 2 == 0:
            continue
        expected = ctx.reference(call)
        if not expected.ok:
            continue
        if call.error is not None and call.error.kind == "exception" and _SIZE_ERROR.search(
                call.error.message or ""):
            return True
        got, exp = call.value, expected.value
        if isinstance(exp, torch.Tensor) and isinstance(got, torch.Tensor) and got.shape != exp.shape:
            return True
    return False


def max_len_unchecked(ctx) -> bool:
    """A ValueError was expected for seq > max_len, and the student's module did not raise one."""
    if not isinstance(ctx.exc, AssertionError) or "expected a ValueError" not in str(ctx.exc):
        return False
    ref = Impl(LAB).reference
    for call in reversed(ctx.calls):
        req = call.req
        if req.get("target") not in (SINUSOIDAL, LEARNED) or req.get("ctor") is None:
            continue
        cls = getattr(ref, req["target"])
        try:
            ctor = bind(cls.__init__, [None, *req["ctor"]["args"]], req["ctor"]["kwargs"])
            x = req["args"][0]
            too_long = x.size(1) > int(ctor["max_len"])
        except (TypeError, ValueError, KeyError, IndexError, AttributeError):
            return False
        raised_value_error = call.error is not None and "ValueError" in call.error.mro
        return too_long and not raised_value_error
    return False


def mistakes():
    base_cls = Impl(LAB).reference.SinusoidalPositionalEncoding

    def wrong(**switches):
        make = functools.partial(table, **switches)
        return Impl(LAB, {FUNCTION: make, SINUSOIDAL: sinusoidal_class(base_cls, make)})

    return [
        FLOAT32_CAST,
        FLOAT32_PRECISION,
        Rule(id="odd_d_model", name="odd d_model not handled",
             hint="with an odd d_model there are d_model // 2 + 1 sine columns but only "
                  "d_model // 2 cosine columns: give the cosines only the angles they need "
                  "(e.g. angles[:, : d_model // 2])",
             predicate=odd_d_model_fails),
        Rule(id="max_len_unchecked", name="max_len not checked",
             hint="check the length first: if x.size(1) > self.max_len, raise a ValueError "
                  "that says so, instead of letting the table slice or the embedding lookup "
                  "fail (or silently use fewer rows)",
             predicate=max_len_unchecked),
        Replay(id="sin_cos_swapped", name="sin and cos swapped",
               hint="the even feature columns (0, 2, 4, ...) hold the sine and the odd ones "
                    "(1, 3, 5, ...) the cosine: pe[:, 0::2] = sin(angles), "
                    "pe[:, 1::2] = cos(angles)",
               variants=[wrong(swap=True)]),
        Replay(id="exponent_i", name="exponent i instead of 2i",
               hint="the pair of columns (2i, 2i+1) uses the angle pos / base**(2i / d_model): "
                    "the exponent is the even column index 2i (torch.arange(0, d_model, 2)) "
                    "over d_model, not the pair number i",
               variants=[wrong(pair_exponent=True)]),
        DETACHED,
    ]
