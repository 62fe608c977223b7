"""Lab 4 mistakes: FeedForward and TransformerBlock.

The wrong modules subclass the reference ``FeedForward`` / ``TransformerBlock`` (same
parameters and constructor, so the recorded state dict loads with strict=True) and override
``forward`` with the reference's steps, one of them wrong.
"""

from __future__ import annotations

import torch.nn.functional as F

from grader.mistakes import DETACHED, FLOAT32_CAST, FLOAT32_PRECISION, Impl, Replay

LAB = "lab4_transformer_block"


def feedforward_class(base, activation):
    """FeedForward that always uses ``activation`` ("relu" or "gelu"), whatever it was built with."""
    act = F.relu if activation == "relu" else F.gelu

    class WrongFeedForward(base):
        def forward(self, x):
            return self.linear2(self.dropout(act(self.linear1(x))))

    return WrongFeedForward


def tanh_gelu_class(base):
    """FeedForward whose "gelu" is the tanh approximation (GPT-2's), not the exact erf GELU."""

    class TanhGeluFeedForward(base):
        def forward(self, x):
            h = self.linear1(x)
            h = F.relu(h) if self.activation == "relu" else F.gelu(h, approximate="tanh")
            return self.linear2(self.dropout(h))

    return TanhGeluFeedForward


def block_class(base, *, norm_first=None, attn_residual=True, ff_residual=True, invert_mask=True,
                feedforward=None):
    """TransformerBlock with one step wrong: a fixed norm placement (``norm_first`` True/False
    instead of self.norm_first), a residual left out, the mask handed over as it is, or a
    FeedForward class that ignores its activation."""

    class WrongTransformerBlock(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if feedforward is not None:
                self.ff.__class__ = feedforward     # same parameters, other forward

        def forward(self, x, mask=None):
            attn_mask = None if mask is None else (~mask if invert_mask else mask)
            pre = self.norm_first if norm_first is None else norm_first
            if pre:
                h = self.norm1(x)
                sa = self.dropout1(self.attn(h, h, h, attn_mask=attn_mask, need_weights=False)[0])
                x = x + sa if attn_residual else sa
                ff = self.dropout2(self.ff(self.norm2(x)))
                x = x + ff if ff_residual else ff
            else:
                sa = self.dropout1(self.attn(x, x, x, attn_mask=attn_mask, need_weights=False)[0])
                x = self.norm1(x + sa if attn_residual else sa)
                ff = self.dropout2(self.ff(x))
                x = self.norm2(x + ff if ff_residual else ff)
            return x

    return WrongTransformerBlock


def mistakes():
    ref = Impl(LAB).reference
    block, ff = ref.TransformerBlock, ref.FeedForward

    def wrong_block(**kw):
        return Impl(LAB, {"TransformerBlock": block_class(block, **kw)})


    def with_feedforward(wrong_ff):
        return Impl(LAB, {"FeedForward": wrong_ff,
                          "TransformerBlock": block_class(block, feedforward=wrong_ff)})

    return [
        FLOAT32_CAST,
        FLOAT32_PRECISION,
        Replay(id="gelu_tanh", name="tanh-approximate GELU",
               hint='activation="gelu" means the exact GELU, x * Phi(x) with the normal CDF '
                    "(erf), as F.gelu and nn.TransformerEncoderLayer compute by default; the "
                    "tanh formula 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) is an "
                    "approximation that differs by up to ~1e-3",
               variants=[with_feedforward(tanh_gelu_class(ff))]),
        Replay(id="mask_not_inverted",
               name="mask passed to nn.MultiheadAttention without inverting it",
               hint="nn.MultiheadAttention reads a boolean attn_mask as True = blocked, the "
                    "opposite of our True = may attend: hand it ~mask",
               variants=[wrong_block(invert_mask=False)]),
        Replay(id="norm_first_ignored", name="norm_first ignored",
               hint="norm_first=True is pre-norm: x = x + dropout1(SA(norm1(x))), then "
                    "x = x + dropout2(FF(norm2(x))); norm_first=False is post-norm: "
                    "x = norm1(x + dropout1(SA(x))), then x = norm2(x + dropout2(FF(x))); "
                    "branch on self.norm_first",
               variants=[wrong_block(norm_first=False), wrong_block(norm_first=True)]),
        Replay(id="missing_residual", name="missing residual",
               hint="each sub-layer is wrapped in a residual connection: add the sub-layer's "
                    "input stream x back to its output (x + dropout1(SA(...)), "
                    "x + dropout2(FF(...))), inside the norm for post-norm",
               variants=[wrong_block(attn_residual=False), wrong_block(ff_residual=False),
                         wrong_block(attn_residual=False, ff_residual=False)]),
        Replay(id="activation_ignored", name="activation ignored",
               hint='FeedForward must use the activation it was built with: F.relu for "relu", '
                    'F.gelu (the exact, erf-based default) for "gelu"; self.activation holds '
                    "the name",
               variants=[with_feedforward(feedforward_class(ff, "relu")),
                         with_feedforward(feedforward_class(ff, "gelu"))]),
        DETACHED,
    ]
