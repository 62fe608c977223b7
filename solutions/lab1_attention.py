"""Lab 1 -- scaled dot-product attention.

Attention lets every position of a sequence build its output from every other position.
Each query vector is compared with every key vector; the comparison scores become a
probability distribution over the keys, and the output is that distribution's average of
the value vectors:

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Why divide by sqrt(d_k)?  A dot product of two d_k-dimensional vectors whose entries have
mean 0 and variance 1 is a sum of d_k such products, so its variance is d_k.  With d_k = 64
the raw scores are typically around +-8, and a softmax of numbers that far apart puts almost
all of its mass on one key.  In that saturated regime the softmax's gradient is nearly zero
and learning stalls.  Dividing by sqrt(d_k) brings the scores back to unit variance.

Masks say which keys a query may look at.  In these labs a boolean mask means True = "may
attend" (the convention of torch.nn.functional.scaled_dot_product_attention; beware that
torch.nn.MultiheadAttention uses the opposite one, True = "blocked").  Blocked scores are
set to -inf so that they get exactly zero weight.  A causal mask lets position i see only
positions j <= i, which is what an autoregressive model needs.  If a query has no allowed
key at all, the softmax of a row of -inf is 0/0 = NaN; we define that row's weights (and
therefore its output) to be all zeros instead.

Attention dropout randomly zeroes some weights while training (each with probability p) and
scales the survivors by 1/(1-p), so the expected weights are unchanged and nothing needs to
be rescaled at evaluation time, when dropout is off.

Cost: the score matrix has seq_q * seq_k entries and each takes d_k multiply-adds, so a
sequence of length L costs O(L^2 d) time and O(L^2) memory -- the reason long inputs are
expensive for Transformers.
"""

import math

import torch
import torch.nn.functional as F


def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0, training=False):
    """Scaled dot-product attention.

    q: (..., seq_q, d_k), k: (..., seq_k, d_k), v: (..., seq_k, d_v)
    mask: optional bool, broadcastable to (..., seq_q, seq_k), True = may attend
    returns (output (..., seq_q, d_v), weights (..., seq_q, seq_k))
    weights = softmax(q @ k^T / sqrt(d_k)) with blocked positions at 0; when training and
    dropout_p > 0, dropout (scaled by 1/(1-dropout_p)) is applied to the weights; the
    returned weights are exactly those multiplied with v, so output == weights @ v.
    """
    # BEGIN SOLUTION
    # hint: scores = q @ k^T / sqrt(d_k); blocked positions get -inf before the softmax.
    # hint: a row with every key blocked must give zeros, not NaN (and no NaN gradients either).
    # hint: dropout acts on the weights, only when training; F.dropout already rescales by 1/(1-p).
    d_k = q.size(-1)
    # Every query against every key in one batched matmul.
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., seq_q, seq_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
        # A row with no allowed key would be all -inf and its softmax NaN.  Give such rows a
        # harmless score of 0 (so softmax and its backward stay finite); the masked_fill
        # below then zeroes them, which also stops any gradient flowing through them.
        fully_blocked = ~mask.any(dim=-1, keepdim=True)  # (..., seq_q, 1)
        scores = scores.masked_fill(fully_blocked, 0.0)
    weights = torch.softmax(scores, dim=-1)  # (..., seq_q, seq_k), rows sum to 1
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    if training and dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    output = weights @ v  # (..., seq_q, d_v)
    return output, weights
    # END SOLUTION


def causal_mask(seq_q, seq_k=None, device=None):
    """bool (seq_q, seq_k) mask, True where key j <= query i (seq_k defaults to seq_q;
    with seq_k > seq_q the queries are the last seq_q positions: True where j <= i + seq_k - seq_q).
    """
    # BEGIN SOLUTION
    # hint: compare a column of query indices with a row of key indices; broadcasting builds the table.
    # hint: with seq_k > seq_q, query i sits at absolute position i + seq_k - seq_q.
    if seq_k is None:
        seq_k = seq_q
    i = torch.arange(seq_q, device=device).unsqueeze(1)  # (seq_q, 1)
    j = torch.arange(seq_k, device=device).unsqueeze(0)  # (1, seq_k)
    return j <= i + (seq_k - seq_q)  # (seq_q, seq_k)
    # END SOLUTION
