"""Lab 4 -- a Transformer encoder block.

A Transformer layer alternates two sub-layers: self-attention, which moves information
between positions, and a position-wise feed-forward network (Linear -> ReLU/GELU -> Linear,
usually 4x wider inside), which transforms each position on its own and supplies the
non-linearity that attention alone lacks.

Each sub-layer is wrapped in a residual connection, x + sublayer(x): the block only has to
learn a correction to its input, and gradients have a direct path through a deep stack.  Layer
normalisation keeps the activations of every position at zero mean and unit variance.  Where
the norm goes is a real design choice:

    post-norm (original Transformer):  x = norm(x + sublayer(x))
    pre-norm  (GPT-2 and most recent): x = x + sublayer(norm(x))

In post-norm every residual sum passes through a norm, so the identity path is interrupted
at every layer; deep post-norm stacks need learning-rate warm-up and care to train.  Pre-norm
leaves the residual stream untouched from input to output, which trains more stably when the
model is deep (it then usually needs one final norm after the last block).

Dropout is applied to each sub-layer's output before it is added back (dropout1, dropout2),
inside the feed-forward network, and on the attention weights.

Masks: in these labs True = "may attend".  torch.nn.MultiheadAttention, used here for the
attention, reads a boolean attn_mask the other way round (True = "blocked"), so our mask is
inverted with ~mask before it is handed over.  Forgetting this lets every query see exactly
the keys it should not.

With the same weights this block computes what torch.nn.TransformerEncoderLayer(d_model,
nhead, d_ff, dropout, activation, batch_first=True, norm_first=...) computes; its self_attn,
linear1, linear2, norm1 and norm2 correspond to our attn, ff.linear1, ff.linear2, norm1, norm2.
"""

import torch.nn as nn
import torch.nn.functional as F


class FeedForward(nn.Module):
    """Position-wise feed-forward network: (..., d_model) -> (..., d_model)."""

    def __init__(self, d_model, d_ff, dropout=0.0, activation="relu"):
        super().__init__()
        if activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu', not {activation!r}")
        self.activation = activation
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        """linear2(dropout(activation(linear1(x))))"""
        # BEGIN SOLUTION
        # hint: self.activation is the name "relu" or "gelu"; torch.nn.functional has both.
        # hint: use GELU's default (exact, erf-based) form, as PyTorch's Transformer layers do.
        act = F.relu if self.activation == "relu" else F.gelu
        return self.linear2(self.dropout(act(self.linear1(x))))  # (..., d_model)
        # END SOLUTION


class TransformerBlock(nn.Module):
    """One Transformer encoder layer (batch-first), post-norm or pre-norm."""

    def __init__(self, d_model=64, num_heads=8, d_ff=256, dropout=0.0,
                 norm_first=False, activation="relu"):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, num_heads, dropout=dropout, batch_first=True)
        self.ff = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x, mask=None):
        """x: (batch, seq, d_model); mask: optional bool (seq, seq), True = may attend.
        post-norm (norm_first=False): x = norm1(x + dropout1(SA(x))); x = norm2(x + dropout2(ff(x)))
        pre-norm  (norm_first=True):  x = x + dropout1(SA(norm1(x)));  x = x + dropout2(ff(norm2(x)))
        With the same weights it equals torch.nn.TransformerEncoderLayer(batch_first=True).
        """
        # BEGIN SOLUTION
        # hint: nn.MultiheadAttention's boolean attn_mask reads True as blocked: opposite to ours.
        # hint: SA(h) is the first element of self.attn(h, h, h, ...); the weights are not needed.
        # hint: pre-norm normalises the sub-layer's input, post-norm the residual sum.
        # nn.MultiheadAttention wants True = blocked, so flip our True = may-attend mask.
        attn_mask = None if mask is None else ~mask  # (T, T)
        if self.norm_first:
            h = self.norm1(x)
            sa = self.attn(h, h, h, attn_mask=attn_mask, need_weights=False)[0]  # (B, T, d_model)
            x = x + self.dropout1(sa)
            x = x + self.dropout2(self.ff(self.norm2(x)))
        else:
            sa = self.attn(x, x, x, attn_mask=attn_mask, need_weights=False)[0]  # (B, T, d_model)
            x = self.norm1(x + self.dropout1(sa))
            x = self.norm2(x + self.dropout2(self.ff(x)))
        return x
        # END SOLUTION
