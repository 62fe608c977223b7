"""Lab 2 mistakes: split_heads / merge_heads and MultiHeadAttention.

The wrong modules subclass the reference ``MultiHeadAttention`` (same parameters, same
constructor, so the recorded state dict loads with strict=True) and override ``forward`` with
the reference's steps, one of them wrong. A student's Lab 2 usually runs their own Lab 1
function, so Lab 1's attention mistakes are catalogued here too (same names), as modules whose
attention step has that mistake.
"""

from __future__ import annotations

from grader.mistakes import (
    DETACHED,
    FLOAT32_CAST,
    FLOAT32_PRECISION,
    DropoutPlacement,
    DropoutSite,
    DropoutStats,
    Impl,
    Replay,
    bind,
)
from grader.mistakes.lab1_attention import NAMES, SWITCHES, attention

LAB = "lab2_multihead"
MHA = "MultiHeadAttention"
VIA_LAB1 = (" (in the attention step of MultiHeadAttention: your Lab 1 "
            "scaled_dot_product_attention, if your Lab 2 calls it)")


def split_right(x, num_heads):
    batch, seq, d_model = x.shape
    if d_model % num_heads != 0:
        raise ValueError(f"d_model ({d_model}) is not divisible by num_heads ({num_heads})")
    return x.reshape(batch, seq, num_heads, d_model // num_heads).transpose(1, 2)


def split_no_transpose(x, num_heads):
    batch, seq, d_model = x.shape
    if d_model % num_heads != 0:
        raise ValueError(f"d_model ({d_model}) is not divisible by num_heads ({num_heads})")
    return x.reshape(batch, num_heads, seq, d_model // num_heads)


def merge_right(x):
    batch, num_heads, seq, d_head = x.shape
    return x.transpose(1, 2).reshape(batch, seq, num_heads * d_head)


def merge_features_first(x):
    """(B, h, T, d) -> (B, T, d, h): each head's features interleaved with the others'."""
    batch, num_heads, seq, d_head = x.shape
    return x.permute(0, 2, 3, 1).reshape(batch, seq, num_heads * d_head)


def merge_no_transpose(x):
    batch, num_heads, seq, d_head = x.shape
    return x.reshape(batch, seq, num_heads * d_head)


def mha_class(base, *, split=split_right, merge=merge_right, scale_d_model=False, **switches):
    """A subclass of the reference MultiHeadAttention whose forward has one step wrong."""

    class WrongMultiHeadAttention(base):
        def forward(self, query, key, value, mask=None, need_weights=True):
            h = self.num_heads
            q = split(self.q_proj(query), h)
            k = split(self.k_proj(key), h)
            v = split(self.v_proj(value), h)
            extra = dict(switches)
            if scale_d_model:
                extra["scale"] = self.d_model
            out, weights = attention(q, k, v, mask=mask, dropout_p=self.dropout,
                                     training=self.training, **extra)
            out = self.out_proj(merge(out))
            return out, (weights if need_weights else None)

    return WrongMultiHeadAttention


def mha_site(base):
    def site(req: dict):
        """Dropout in a MultiHeadAttention call: on the returned weights."""
        if req.get("target") != MHA or req.get("ctor") is None or req.get("op") != "call":
            return None
        ctor = bind(base.__init__, [None, *req["ctor"]["args"]], req["ctor"]["kwargs"])
        return DropoutSite(p=float(ctor["dropout"]), training=bool(req.get("train", False)),
                           clean_req=dict(req, train=False), component=lambda reply: reply[1])
    return site


def mistakes():
    ref = Impl(LAB).reference
    base = ref.MultiHeadAttention

    def mha(**kw):
        return Impl(LAB, {MHA: mha_class(base, **kw)})

    inherited = {key: Replay(id=key, name=NAMES[key][0], hint=NAMES[key][1] + VIA_LAB1,
                             variants=[mha(**sw) for sw in ways])
                 for key, ways in SWITCHES.items()}
    site = mha_site(base)
    return [
        FLOAT32_CAST,
        FLOAT32_PRECISION,
        Replay(id="split_no_transpose", name="heads split by reshape without transpose",
               hint="reshape (batch, seq, d_model) to (batch, seq, heads, d_head) first, then "
                    "transpose(1, 2) to (batch, heads, seq, d_head); reshaping straight to "
                    "(batch, heads, seq, d_head) mixes features of different positions",
               variants=[Impl(LAB, {"split_heads": split_no_transpose,
                                    MHA: mha_class(base, split=split_no_transpose)})]),
        Replay(id="merge_order", name="heads merged in the wrong order",
               hint="undo split_heads step by step: transpose(1, 2) back to (batch, seq, heads, "
                    "d_head), then reshape to (batch, seq, d_model), so head h fills features "
                    "h*d_head:(h+1)*d_head",
               variants=[Impl(LAB, {"merge_heads": merge_features_first,
                                    MHA: mha_class(base, merge=merge_features_first)}),
                         Impl(LAB, {"merge_heads": merge_no_transpose,
                                    MHA: mha_class(base, merge=merge_no_transpose)})]),
        Replay(id="scale_d_model", name="scaling by sqrt(d_model) instead of sqrt(d_head)",
               hint="each head dots vectors of d_head = d_model // num_heads features, so its "
                    "scores are divided by sqrt(d_head); calling your Lab 1 function on the "
                    "per-head q, k, v does this for you",
               variants=[mha(scale_d_model=True)]),
        inherited["nan_blocked_rows"],
        inherited["mask_fill_finite"],
        inherited["mask_inverted"],
        inherited["mask_after_softmax"],
        inherited["softmax_dim"],
        inherited["no_scale"],
        DropoutStats(id="dropout_in_eval", name=NAMES["dropout_in_eval"][0],
                     hint=NAMES["dropout_in_eval"][1] + VIA_LAB1, mode="eval", site=site),
        DropoutStats(id="dropout_no_rescale", name=NAMES["dropout_no_rescale"][0],
                     hint=NAMES["dropout_no_rescale"][1] + VIA_LAB1, mode="no_rescale", site=site),
        DropoutPlacement(id="weights_before_dropout", name=NAMES["weights_before_dropout"][0],
                         hint=NAMES["weights_before_dropout"][1] + VIA_LAB1, mode="output_only",
                         site=site),
        DropoutPlacement(id="dropout_missing", name=NAMES["dropout_missing"][0],
                         hint=NAMES["dropout_missing"][1] + VIA_LAB1, mode="none", site=site),
        DETACHED,
    ]

