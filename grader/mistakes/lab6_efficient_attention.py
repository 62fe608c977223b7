"""Lab 6 mistakes: the online softmax, the sliding window, the feature map and the causal
prefix sums of linear attention, the causal alignment of chunked attention.

``chunked``, ``window_mask``/``window_attention``, ``features``, ``linear`` and ``quadratic``
are the reference functions (solutions/lab6_efficient_attention.py) with switches that put
one classic mistake in; with every switch off they give the reference's values (the window
functions by another route: full attention under the band mask, which trusted code may
build). The wrong linear forms take their feature map as an argument, since the reference's
call their own module's ``elu_feature_map``.
"""

from __future__ import annotations

import functools
import math
import re

import torch
import torch.nn.functional as F

from grader.mistakes import DETACHED, FLOAT32_CAST, FLOAT32_PRECISION, Impl, Replay, Rule, bind

LAB = "lab6_efficient_attention"


def chunked(q, k, v, causal=False, key_padding_mask=None, chunk_size=128, *, rescale="both",
            detach_max=True, top_left=False, acc_like_q=False):
    """The reference chunked_attention. rescale: which running quantities are multiplied by
    exp(m_old - m_new) when the max grows ("both": right; "none", "sum" (l only), "output"
    (acc only)); detach_max: no gradient through the running max (the reference's; students
    often let it flow, which changes the gradients only when the rescale is wrong);
    top_left: causal query i sees keys j <= i instead of j <= i + Lk - Lq; acc_like_q: the
    running output torch.zeros_like(q), (..., Lq, d) where it is (..., Lq, dv)."""
    lq, lk = q.size(-2), k.size(-2)
    scale = 1.0 / math.sqrt(q.size(-1))
    offset = 0 if top_left else lk - lq
    rows = torch.arange(lq, device=q.device).unsqueeze(1)
    stats_shape = q.shape[:-1] + (1,)
    m = torch.full(stats_shape, float("-inf"), dtype=q.dtype, device=q.device)
    l = torch.zeros(stats_shape, dtype=q.dtype, device=q.device)
    width = q.size(-1) if acc_like_q else v.size(-1)
    acc = torch.zeros(q.shape[:-1] + (width,), dtype=q.dtype, device=q.device)
    for start in range(0, lk, chunk_size):
        stop = min(start + chunk_size, lk)
        scores = q @ k[..., start:stop, :].transpose(-2, -1) * scale
        allowed = None
        if causal:
            cols = torch.arange(start, stop, device=q.device).unsqueeze(0)
            allowed = cols <= rows + offset
        if key_padding_mask is not None:
            pad = key_padding_mask
            if pad.size(-1) != 1:
                pad = pad[..., start:stop]
            allowed = pad if allowed is None else allowed & pad
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        chunk_max = scores.detach() if detach_max else scores
        m_new = torch.maximum(m, chunk_max.amax(dim=-1, keepdim=True))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - m_safe)
        p = torch.exp(scores - m_safe)
        l = (l * alpha if rescale in ("both", "sum") else l) + p.sum(dim=-1, keepdim=True)
        acc = (acc * alpha if rescale in ("both", "output") else acc) + p @ v[..., start:stop, :]
        m = m_new
    return acc / torch.where(l > 0, l, torch.ones_like(l))


def window_mask(seq_len, window, device=None, *, shift=0):
    """sliding_window_mask with ``shift`` more keys per query (+1: i - window <= j <= i)."""
    i = torch.arange(seq_len, device=device).unsqueeze(1)
    j = torch.arange(seq_len, device=device).unsqueeze(0)
    return (j <= i) & (j > i - window - shift)


def window_attention(q, k, v, window, *, shift=0, out_like_q=False):
    """Full attention under window_mask(shift): a row with no key (window + shift < 1) is NaN,
    as a plain softmax of -inf gives. out_like_q: written into torch.zeros_like(q), which
    refuses an output (..., L, dv) narrower than q as a copy of the wrong size."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    mask = window_mask(q.size(-2), window, device=q.device, shift=shift)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    out = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v
    if out_like_q:
        like_q = torch.zeros_like(q)
        like_q[...] = out
        return like_q
    return out


FEATURES = {
    "elu_plus_one": lambda x: F.elu(x) + 1.0,
    "elu": F.elu,
    "relu": F.relu,
}


def features(x, *, phi="elu_plus_one"):
    return FEATURES[phi](x)


def linear(q, k, v, causal=False, eps=1e-6, *, phi="elu_plus_one", exclusive=False):
    """The reference linear_attention; exclusive: the causal prefix sums stop at j < i (query
    i does not see key i)."""
    fq, fk = features(q, phi=phi), features(k, phi=phi)
    if not causal:
        state = fk.transpose(-2, -1) @ v
        z = fk.sum(dim=-2, keepdim=True)
        return (fq @ state) / ((fq * z).sum(dim=-1, keepdim=True) + eps)
    block = 128
    state = torch.zeros(fk.shape[:-2] + (fk.size(-1), v.size(-1)), dtype=v.dtype, device=v.device)
    z = torch.zeros(fk.shape[:-2] + (fk.size(-1),), dtype=fk.dtype, device=fk.device)
    outputs = []
    for start in range(0, q.size(-2), block):
        stop = min(start + block, q.size(-2))
        fq_b, fk_b, v_b = fq[..., start:stop, :], fk[..., start:stop, :], v[..., start:stop, :]
        outer = fk_b.unsqueeze(-1) * v_b.unsqueeze(-2)
        states = state.unsqueeze(-3) + outer.cumsum(dim=-3)
        zs = z.unsqueeze(-2) + fk_b.cumsum(dim=-2)
        if exclusive:
            seen_s, seen_z = states - outer, zs - fk_b
        else:
            seen_s, seen_z = states, zs
        num = (fq_b.unsqueeze(-2) @ seen_s).squeeze(-2)
        den = (fq_b * seen_z).sum(dim=-1, keepdim=True)
        outputs.append(num / (den + eps))
        state, z = states[..., -1, :, :], zs[..., -1, :]
    return torch.cat(outputs, dim=-2)


def quadratic(q, k, v, causal=False, eps=1e-6, *, phi="elu_plus_one", exclusive=False):
    """The reference linear_attention_quadratic; exclusive: causal rows without the diagonal."""
    weights = features(q, phi=phi) @ features(k, phi=phi).transpose(-2, -1)
    if causal:
        seq = q.size(-2)
        keep = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril(-1 if exclusive else 0)
        weights = weights.masked_fill(~keep, 0.0)
    return (weights / (weights.sum(dim=-1, keepdim=True) + eps)) @ v


# What torch's allocator (or the C++ runtime) says when the sandbox's memory limit refuses
# an allocation; the size, where given, is checked against an (L, L) matrix.
_OUT_OF_MEMORY = re.compile(r"not enough memory|can't allocate|cannot allocate|out of memory|"
                            r"bad_alloc|MemoryError", re.IGNORECASE)
_ASKED_BYTES = re.compile(r"allocate (\d+) bytes")
LINEAR_MEMORY = ("linear_attention", "chunked_attention", "sliding_window_attention")


def quadratic_memory(ctx) -> bool:
    """A function that must stay linear in L ran out of memory on a long input, where an
    (L, L) matrix no longer fits, while its answers on the shorter inputs of the same test
    are the reference's: the values are right, the (L, L) matrix is the mistake. (Tried
    first, and cheap when nothing ran out of memory: the other mistakes' replays of the
    long input would spend the diagnosis's time.)"""
    own = [c for c in ctx.calls if c.req.get("target") in LINEAR_MEMORY]
    failed = [c for c in own if c.error is not None]
    if not failed or len(failed) == len(own):
        return False
    for call in failed:
        message = call.error.message or ""
        if not (_OUT_OF_MEMORY.search(message) or "MemoryError" in call.error.mro):
            return False
        args = call.req.get("args") or []
        if not args or not isinstance(args[0], torch.Tensor) or args[0].dim() < 2:
            return False
        length = int(args[0].shape[-2])
        asked = _ASKED_BYTES.search(message)
        if asked and int(asked.group(1)) < length * length:
            return False                # a smaller allocation failed: not an (L, L) matrix
    return all(ctx.matches_reference(c) for c in own if c.error is None)


def window_below_one_not_refused(ctx) -> bool:
    """The test failed waiting for a ValueError on its last call, a sliding_window_attention
    whose window is below 1, which the reference refuses with ValueError, where the
    student's code returned or raised another exception (16 // window: ZeroDivisionError)."""
    if not isinstance(ctx.exc, AssertionError) or "expected a ValueError" not in str(ctx.exc):
        return False
    call = ctx.calls[-1] if ctx.calls else None
    if call is None or call.req.get("target") != "sliding_window_attention":
        return False
    if call.error is not None and "ValueError" in call.error.mro:
        return False
    try:
        window = bind(Impl(LAB).reference.sliding_window_attention, call.req.get("args") or [],
                      call.req.get("kwargs") or {})["window"]
    except (TypeError, KeyError):
        return False
    ref = ctx.reference(call)
    return (isinstance(window, int) and window < 1 and not ref.ok
            and isinstance(ref.error, ValueError))


_SIZES = re.compile(r"\((\d+)\)|(\d+)\]")


class WidthCrashReplay(Replay):
    """The output built as wide as the queries: named only for calls whose values are
    narrower than the queries, where each of the student's crashes names both widths (the
    sizes a broadcast or a copy of the wrong width reports), so that another crash on the
    same calls (a padding mask of the wrong shape) is not taken for it."""

    def matches(self, ctx) -> bool:
        for call in ctx.calls:
            if call.error is None:
                continue
            args = call.req.get("args") or []
            if len(args) < 3 or not all(isinstance(t, torch.Tensor) for t in args[:3]):
                return False
            d, dv = int(args[0].size(-1)), int(args[2].size(-1))
            sizes = {int(a or b) for a, b in _SIZES.findall(call.error.message or "")}
            if not (dv < d and {d, dv} <= sizes):
                return False
        return super().matches(ctx)


def mistakes():
    def impl(**overrides):
        return Impl(LAB, overrides)

    def online(**switches):
        return impl(chunked_attention=functools.partial(chunked, **switches))

    def window(shift):
        return impl(sliding_window_mask=functools.partial(window_mask, shift=shift),
                    sliding_window_attention=functools.partial(window_attention, shift=shift))

    def feature_map(phi):
        return impl(elu_feature_map=functools.partial(features, phi=phi),
                    linear_attention=functools.partial(linear, phi=phi),
                    linear_attention_quadratic=functools.partial(quadratic, phi=phi))

    return [
        Rule(id="quadratic_memory", name="an (L, L) matrix built where memory must stay linear",
             hint="your values are right at shorter lengths, but at the long one the call ran "
                  "out of memory, as an (L, L) matrix does (gigabytes at tens of thousands of "
                  "positions); linear attention computes phi(q) (phi(k)^T v), a (d, d_v) state, never "
                  "phi(q) phi(k)^T; causal: prefix sums of the state, carried block by block",
             predicate=quadratic_memory),
        FLOAT32_CAST,
        FLOAT32_PRECISION,
        Replay(id="online_softmax_no_rescale", name="online softmax not rescaled",
               hint="when a chunk raises a query's running max from m_old to m_new, the sum l "
                    "and the output acc gathered so far were computed relative to m_old: "
                    "multiply both by exp(m_old - m_new) before adding the new chunk's terms",
               variants=[online(rescale=r, detach_max=d)
                         for r in ("none", "output", "sum") for d in (False, True)]),
        Replay(id="causal_top_left", name="causal mask aligned top-left",
               hint="with more keys than queries (Lk > Lq) the queries are the LAST Lq "
                    "positions: query i sits at position i + Lk - Lq and sees keys "
                    "j <= i + Lk - Lq; build each chunk's mask from the absolute key "
                    "indices of the chunk and that offset, not from j <= i",
               variants=[online(top_left=True), online(top_left=True, detach_max=False)]),
        Replay(id="window_off_by_one", name="sliding window off by one",
               hint="query i sees exactly window keys, itself and the window - 1 before it: "
                    "i - window < j <= i (strict on the left); window=1 means only itself",
               variants=[window(1), window(-1)]),
        Replay(id="feature_map_not_positive", name="feature map not positive",
               hint="phi(x) = elu(x) + 1 is strictly positive, so every weight "
                    "phi(q_i).phi(k_j) is positive and the denominators cannot vanish; elu "
                    "alone is negative for x < 0 and relu is 0 there",
               variants=[feature_map("elu"), feature_map("relu")]),
        Replay(id="prefix_sum_exclusive", name="causal prefix sums exclude the current key",
               hint="causal query i sees keys j <= i, itself included: its state is the "
                    "inclusive prefix sum (torch.cumsum includes position i); subtracting the "
                    "current term or shifting by one leaves key i out",
               variants=[impl(linear_attention=functools.partial(linear, exclusive=True)),
                         impl(linear_attention=functools.partial(linear, exclusive=True),
                              linear_attention_quadratic=functools.partial(quadratic,
                                                                           exclusive=True))]),
        WidthCrashReplay(id="output_width_of_queries", name="values narrower than the queries",
               hint="the output's last dim is the values' width: (..., Lq, dv) with "
                    "dv = v.size(-1), which may differ from d = q.size(-1); an accumulator "
                    "or output made with torch.zeros_like(q) or empty_like(q) has the "
                    "queries' width, so build it from v's (q.shape[:-1] + (v.size(-1),))",
               variants=[online(acc_like_q=True),
                         impl(sliding_window_attention=functools.partial(window_attention,
                                                                         out_like_q=True))]),
        Rule(id="window_below_one_not_refused", name="a window below 1 not refused",
             hint="sliding_window_attention must check its window before using it: a window "
                  "below 1 (0 or negative) leaves every query without a key, so raise a "
                  "ValueError that says so first, instead of letting a division, a range or "
                  "a slice by the window fail on it (or return empty rows)",
             predicate=window_below_one_not_refused),
        DETACHED,
    ]
