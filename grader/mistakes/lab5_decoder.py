"""Lab 5 mistakes: the KV cache of DecoderLayer / DecoderLM.

The wrong modules subclass the reference ``DecoderLayer`` / ``DecoderLM`` (same parameters
and constructor, so the recorded state dict loads with strict=True) and override
``forward`` / ``forward_step`` with the reference's steps, one of them wrong. A wrong layer
reaches a model through its layers' class (``DecoderLM`` builds the reference layer by name);
``generate`` is inherited, so it decodes with the wrong ``forward_step``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from grader.mistakes import DETACHED, FLOAT32_CAST, FLOAT32_PRECISION, Impl, Replay, Rule

LAB = "lab5_decoder"


def layer_class(base, *, mask="bottom_right", cache="append", cat_dim=2):
    """DecoderLayer with one step wrong.

    mask: "bottom_right" (right); "top_left" (query i sees keys j <= i, as is_causal=True);
    "top_left_chunks" (top-left for a chunk of several tokens, no mask for one token, as
    is_causal=T_new > 1); "square" (a (T_new, T_new) lower triangle, as without a cache:
    one token broadcasts it, a chunk after a cache crashes); "none_after_cache" (no mask when a cache is given, as
    is_causal=past_kv is None).
    cache: "append" (right); "only_new" (attends over all, returns only the new k, v);
    "ignored" (neither attends over nor keeps the past); "not_appended" (attends over all,
    returns the past unchanged); "prepend" (the new k, v joined before the past ones);
    "unprojected" (the cache holds norm1(x) split into heads, before the key/value
    projections, and each call projects past and new together). cat_dim: the axis the past
    and new k, v are joined on.
    """

    class WrongDecoderLayer(base):
        def forward(self, x, past_kv=None):
            batch, t_new, d_model = x.shape
            h = self.norm1(x)

            def heads(t):
                return t.view(batch, t_new, self.num_heads, self.d_head).transpose(1, 2)

            q, k_new, v_new = heads(self.q_proj(h)), heads(self.k_proj(h)), heads(self.v_proj(h))
            k, v = k_new, v_new
            if cache == "unprojected":
                seen = heads(h) if past_kv is None else torch.cat([past_kv[0], heads(h)], dim=2)
                t_seen = seen.size(2)
                merged = seen.transpose(1, 2).reshape(batch, t_seen, d_model)

                def seen_heads(t):
                    return t.view(batch, t_seen, self.num_heads, self.d_head).transpose(1, 2)

                k, v = seen_heads(self.k_proj(merged)), seen_heads(self.v_proj(merged))
            elif past_kv is not None and cache == "prepend":
                k = torch.cat([k_new, past_kv[0]], dim=2)
                v = torch.cat([v_new, past_kv[1]], dim=2)
            elif past_kv is not None and cache != "ignored":
                k = torch.cat([past_kv[0], k_new], dim=cat_dim)
                v = torch.cat([past_kv[1], v_new], dim=cat_dim)
            t_all = k.size(2)
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
            ones = torch.ones(t_new, t_all, dtype=torch.bool, device=x.device)
            if mask == "bottom_right":
                allowed = ones.tril(t_all - t_new)
            elif mask == "top_left":
                allowed = ones.tril()
            elif mask == "top_left_chunks":
                allowed = ones.tril() if t_new > 1 else ones
            elif mask == "square":      # (T_new, T_new), as if there were no cache
                allowed = torch.ones(t_new, t_new, dtype=torch.bool, device=x.device).tril()
            else:  # "none_after_cache"
                allowed = ones if past_kv is not None else ones.tril(t_all - t_new)
            scores = scores.masked_fill(~allowed, float("-inf"))
            attn = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, t_new, d_model)
            h = x + self.dropout(self.out_proj(attn))
            y = h + self.dropout(self.ff(self.norm2(h)))
            if cache in ("only_new", "ignored"):
                return y, (k_new, v_new)
            if cache == "not_appended" and past_kv is not None:
                return y, (past_kv[0], past_kv[1])
            if cache == "unprojected":
                return y, (seen, seen)
            return y, (k, v)

    return WrongDecoderLayer


def lm_class(base, *, positions="offset", layer=None):
    """DecoderLM whose forward_step counts positions wrongly, or whose layers are ``layer``.

    positions: "offset" (right: T_past .. T_past + T_new - 1); "restart" (0 .. T_new - 1 on
    every call: the offset is not carried); "plus_one" / "minus_one" (T_past +- 1 after a
    cache); "from_one" (one too far on every call, 1 + T_past ..).
    """

    class WrongDecoderLM(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if layer is not None:
                for module in self.layers:
                    module.__class__ = layer        # same parameters, other forward

        def forward(self, tokens):
            return self.forward_step(tokens)[0]     # the reference's forward, via its steps

        def forward_step(self, tokens, cache=None):
            t_new = tokens.size(1)
            past = 0 if cache is None else cache[0][0].size(2)
            if past + t_new > self.max_len:
                raise ValueError("too long")
            start = {"offset": past, "restart": 0, "from_one": past + 1,
                     "plus_one": past + 1 if cache is not None else 0,
                     "minus_one": past - 1 if cache is not None else 0}[positions]
            x = self.tok_emb(tokens) + self.pos_emb(torch.arange(start, start + t_new))
            new_cache = []
            for i, module in enumerate(self.layers):
                x, kv = module(x, None if cache is None else cache[i])
                new_cache.append(kv)
            return self.head(self.norm(x)), new_cache

    return WrongDecoderLM


_SHAPE_ERROR = re.compile(r"[Ss]izes? of tensors? must match|size of tensor|shapes? cannot be "
                          r"multiplied|must match the size|Expected size")


@dataclass
class ShapeCrashReplay(Replay):
    """A Replay whose variants raise where the student's code raised: it names the mistake
    only when each of the student's errors is a shape mismatch (torch.cat or a matmul
    refusing the sizes), so that any other crash is not taken for it."""

    def matches(self, ctx) -> bool:
        for call in ctx.calls:
            if call.error is not None and not (call.error.kind == "exception" and
                                               _SHAPE_ERROR.search(call.error.message or "")):
                return False
        return super().matches(ctx)


def value_error_missing(ctx) -> bool:
    """The test failed waiting for a ValueError, and on the call it waited on the reference
    raises ValueError where the student's code returned or raised something else (such as
    pos_emb's IndexError past its table)."""
    if not isinstance(ctx.exc, AssertionError) or "expected a ValueError" not in str(ctx.exc):
        return False
    for call in reversed(ctx.calls):
        if call.error is not None and "ValueError" in call.error.mro:
            continue                    # refused as it should: not the call the test waits on
        ref = ctx.reference(call)
        return not ref.ok and isinstance(ref.error, ValueError)
    return False


def mistakes():
    ref = Impl(LAB).reference
    lm, layer = ref.DecoderLM, ref.DecoderLayer

    def wrong_positions(positions):
        return Impl(LAB, {"DecoderLM": lm_class(lm, positions=positions)})

    def wrong_layer(**kw):
        wrong = layer_class(layer, **kw)
        return Impl(LAB, {"DecoderLayer": wrong, "DecoderLM": lm_class(lm, layer=wrong)})

    return [
        FLOAT32_CAST,
        FLOAT32_PRECISION,
        Replay(id="cache_positions_restart", name="positions restart at 0 after a cache",
               hint="forward_step must carry the positional offset: the new tokens sit at "
                    "positions T_past .. T_past + T_new - 1, where T_past is the cache's "
                    "length (cache[0][0].size(2)), so use pos_emb(torch.arange(T_past, "
                    "T_past + T_new)), not positions counted from 0 on every call",
               variants=[wrong_positions("restart")]),
        Replay(id="cache_positions_off_by_one", name="cache positions off by one",
               hint="the first new token's position is exactly the cache's length T_past "
                    "(positions 0 .. T_past - 1 are cached): start the positions at T_past, "
                    "not at T_past + 1 or T_past - 1",
               variants=[wrong_positions("plus_one"), wrong_positions("minus_one"),
                         wrong_positions("from_one")]),
        Replay(id="chunk_causal_top_left",
               name="causal mask aligned top-left for a chunk after a cache",
               hint="query i of a chunk after T_past cached keys is at position T_past + i and "
                    "sees keys j <= T_past + i: mask = ones(T_new, T_past + T_new).tril(T_past), "
                    "aligned bottom-right; is_causal=True aligns top-left (query i sees keys "
                    "j <= i), so pass an explicit attn_mask",
               variants=[wrong_layer(mask="top_left"), wrong_layer(mask="top_left_chunks"),
                         wrong_layer(mask="none_after_cache")]),
        ShapeCrashReplay(id="chunk_mask_square",
               name="a (T_new, T_new) causal mask where the scores are (T_new, T_past + T_new)",
               hint="a chunk of T_new tokens after T_past cached ones has T_past + T_new keys: "
                    "its mask is ones(T_new, T_past + T_new).tril(T_past), aligned "
                    "bottom-right; a (T_new, T_new) triangle fits only without a cache (and a "
                    "(1, 1) one broadcasts, so single tokens pass and a chunk after a cache "
                    "crashes)",
               variants=[wrong_layer(mask="square")]),
        Replay(id="cache_only_new", name="the cache keeps only the new keys",
               hint="DecoderLayer must return k_all, v_all = the past keys/values followed by "
                    "the new ones, torch.cat([past_k, k], dim=2), so the cache grows by "
                    "T_new per call; returning only this call's k, v loses every earlier "
                    "position",
               variants=[wrong_layer(cache="only_new"), wrong_layer(cache="ignored")]),
        Replay(id="cache_not_appended", name="new keys not appended to the cache",
               hint="the returned cache must include this call's keys/values: return the "
                    "concatenation torch.cat([past_k, k], dim=2) (and the same for v), not "
                    "the past_kv that came in, so the next step sees this token too",
               variants=[wrong_layer(cache="not_appended")]),
        Replay(id="cache_prepended", name="new keys put before the cached ones",
               hint="the cache is in position order: k_all = torch.cat([past_k, k], dim=2), "
                    "the T_past cached keys first and this call's keys after them (the same "
                    "for v); torch.cat([k, past_k]) puts the newest position first, so the "
                    "mask and the next call's positions no longer match the keys",
               variants=[wrong_layer(cache="prepend")]),
        Replay(id="cache_before_projection", name="the cache holds inputs, not keys and values",
               hint="cache what k_proj and v_proj return, split into heads: the past_kv "
                    "given to DecoderLayer are keys and values (B, num_heads, T_past, d_head), "
                    "to be joined with this call's projected k, v as they are; caching "
                    "norm1(x) and projecting it again on every call returns the wrong cache "
                    "and treats a given cache as inputs",
               variants=[wrong_layer(cache="unprojected")]),
        ShapeCrashReplay(id="cache_wrong_axis", name="cache concatenated on the wrong axis",
               hint="keys and values are (B, num_heads, T, d_head): the sequence axis is "
                    "dim 2 (or -2), so join past and new with torch.cat([past_k, k], dim=2); "
                    "dim=1 joins the heads",
               variants=[wrong_layer(cat_dim=1), wrong_layer(cat_dim=-1),
                         wrong_layer(cat_dim=0)]),
        Rule(id="step_max_len_unchecked", name="too long a sequence not refused",
             hint="forward, forward_step and generate must each check the total length "
                  "first (forward_step: the cache's T_past plus T_new) and raise a ValueError "
                  "past max_len, before pos_emb is indexed; an embedding lookup past its "
                  "table raises IndexError instead",
             predicate=value_error_missing),
        DETACHED,
    ]
