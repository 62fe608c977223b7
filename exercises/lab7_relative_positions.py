# Generated from solutions/lab7_relative_positions.py by `grader stubs`. Fill in the TODOs; keep the given code.
"""Lab 7 -- positions that generalise: rotary embeddings (RoPE) and linear biases (ALiBi).

Lab 3 gave each token its *absolute* position: a vector added to the embedding, sinusoidal
(a formula) or learned (a table of max_len rows).  Attention then compares two tokens through

    (x_m + p_m) . (x_n + p_n) = x_m.x_n + x_m.p_n + p_m.x_n + p_m.p_n

and the cross terms x_m.p_n and p_m.x_n depend on where the two tokens sit, not only on how
far apart they are.  A model trained on sequences of up to L tokens has seen the positions
0..L-1 only.  Past them a learned table has no row at all (the lookup fails), and the
sinusoidal formula gives vectors the model never saw, whose cross terms move the attention
pattern of the very same content.  What language mostly needs is the *relative* position:
"the word two before me".  Two ways to build that into the scores themselves:

RoPE (rotary position embedding; Su et al., RoFormer, 2021).  Split each query and key of
d_head features into d_head / 2 interleaved pairs (x[2i], x[2i+1]) and treat each pair as a
point in the plane (a complex number x[2i] + j x[2i+1]).  At position m, rotate pair i by
the angle m * theta_i, theta_i = base^(-2i / d_head) (the frequencies of lab 3's table):

    out[2i]   = x[2i] cos(m theta_i) - x[2i+1] sin(m theta_i)
    out[2i+1] = x[2i] sin(m theta_i) + x[2i+1] cos(m theta_i)

A dot product of two rotated pairs only sees the *difference* of their angles:
(R_m q) . (R_n k) = q . R_(n-m) k, so every score depends on the positions through m - n
alone.  Shift a query and all its keys by s (one token or a hundred thousand) and the scores
stay.  Nothing is added to the values or the residual stream, no table has to be built in
advance: the angle is computed from the position itself, for any position.  (Some libraries
pair feature i with feature i + d_head / 2, the "rotate-half" layout; it is a different
function with the same property, and weights trained under one do not work under the other.
This lab follows the paper: interleaved pairs.)

Precision: float32 keeps about 7 significant digits, so an angle m * theta_i near 100000
radians is known only to ~0.004 radians.  The maths is exactly shift-invariant; float32
arithmetic far out is not.  apply_rope computes its angles in x's dtype, so float64 in gives
float64 accuracy (tests of the property at large positions run in float64).

ALiBi (attention with linear biases; Press, Smith and Lewis, 2022).  No position vectors at
all: each head h adds to the score of query i and key j a penalty that grows linearly with
their distance, -m_h |i - j|.  The slopes m_h form a geometric sequence: for n heads (a
power of two) m_h = 2^(-8 (h + 1) / n), so with 8 heads 1/2, 1/4, ..., 1/256: some heads look
only at their close neighbours, others far back.  For n not a power of two, the paper's code
takes the slopes of the closest smaller power of two m and then every other slope of 2m (the
ones that fall between them), first n - m of those.  The bias depends only on the distance,
so it extends to any length, and because far keys are penalised the attention stays local
where the model was never trained.  With more keys than queries (a chunk after a cache) query
i sits at absolute position i + seq_k - seq_q, as for causal masks.

The comparison at the end of the lab (``extrapolation_comparison``) puts the same W tokens at
positions 0..W-1 (inside the "training" length) and at offset..offset+W-1 (past it) and
measures how far each scheme's attention pattern moves: the learned table cannot even look
the positions up, the sinusoidal pattern moves, RoPE's and ALiBi's stay exactly where they
were.  It also hands back the weights past the training length, the evidence for each
scheme's answer.
"""

import math

import torch


def rope_frequencies(d_head, base=10000.0, dtype=torch.float32):
    """(d_head // 2,) in dtype: theta_i = base ** (-2i / d_head). ValueError if d_head is odd.
    apply_rope computes its angles in x's dtype (float64 in, float64 accuracy out).
    """
    # TODO(Lab 7): a rotation needs pairs of features: refuse an odd d_head with a ValueError that says so.
    # TODO(Lab 7): the exponents are the even feature indices 2i = 0, 2, 4, ... over d_head (torch.arange(0, d_head, 2)).
    raise NotImplementedError("Lab 7: rope_frequencies")


def apply_rope(x, positions, base=10000.0):
    """Rotary position embedding (RoFormer): x (..., T, d_head), positions long (T,) or
    broadcastable to (..., T). Each interleaved pair (x[..., 2i], x[..., 2i+1]) is rotated
    by the angle positions * theta_i:
        out[2i]   = x[2i] cos - x[2i+1] sin,   out[2i+1] = x[2i] sin + x[2i+1] cos.
    (The 'rotate-half' pairing (i, i + d_head/2) of some libraries is a different convention.)
    """
    # TODO(Lab 7): angles = positions (as x's dtype) times theta: (..., T, 1) * (d_head // 2,) -> (..., T, d_head // 2).
    # TODO(Lab 7): the pairs are the even and the odd features: x[..., 0::2] and x[..., 1::2].
    # TODO(Lab 7): put the rotated pairs back interleaved (torch.stack on a new last axis, then flatten).
    raise NotImplementedError("Lab 7: apply_rope")


def rope_scores(q, k, q_positions, k_positions, base=10000.0):
    """apply_rope(q, q_positions) @ apply_rope(k, k_positions)^T / sqrt(d_head):
    (..., Tq, Tk); depends on positions only through q_position - k_position.
    """
    # TODO(Lab 7): rotate the queries and the keys by their own positions, then the usual scaled dot product.
    raise NotImplementedError("Lab 7: rope_scores")


def alibi_slopes(num_heads):
    """float32 (num_heads,): for a power of two n, 2 ** (-8 * (h + 1) / n), h = 0..n-1; else
    the slopes of the closest smaller power of two m followed by every other slope of 2m
    (Press et al., 2022, as in their reference code), first num_heads - m of them.
    """
    # TODO(Lab 7): for a power of two n the slopes are a geometric sequence: 2 ** (-8 / n) to the powers 1, 2, ..., n.
    # TODO(Lab 7): otherwise: the slopes of m (the largest power of two below num_heads), then every other slope of 2m ([0::2]) until there are num_heads.
    raise NotImplementedError("Lab 7: alibi_slopes")


def alibi_bias(num_heads, seq_q, seq_k):
    """float32 (num_heads, seq_q, seq_k): -slope_h * |i + seq_k - seq_q - j| (query i at
    absolute position i + seq_k - seq_q), added to the scores before the softmax.
    """
    # TODO(Lab 7): query i sits at absolute position i + seq_k - seq_q (the last query meets the last key).
    # TODO(Lab 7): distances |position_i - j| as a (seq_q, seq_k) table, times each head's slope: (num_heads, 1, 1).
    # TODO(Lab 7): a penalty: the bias is minus the slope times the distance.
    raise NotImplementedError("Lab 7: alibi_bias")


def extrapolation_comparison(q, k, train_len, offset, num_heads=4, base=10000.0):
    """How four position schemes treat positions past the training length. q, k: (W, d_head)
    (d_head even, W <= train_len): the content of W tokens, placed once at positions 0..W-1
    (seen in training) and once at offset..offset+W-1 (offset + W > train_len: past it).
    Under each scheme, the attention weights of the W queries over the W keys (a softmax of
    the scores over the keys, no mask) are computed for both placements, in q's dtype:
      "sinusoidal": (q + PE) (k + PE)^T / sqrt(d_head), PE by lab 3's formula at the
                    positions (built only for the positions used, never from 0 to offset);
      "learned":    the same with rows of a learned table torch.nn.Embedding(train_len,
                    d_head): the positions past train_len have no row, the lookup raises;
      "rope":       rope_scores(q, k, positions, positions, base);
      "alibi":      q k^T / sqrt(d_head) - slope_h |p_i - p_j| (alibi_slopes(num_heads)),
                    every head.
    Returns {scheme: {"raised": bool, "max_weight_change": float or None,
    "weights_past": tensor or None}}: max_weight_change = max |weights past - weights inside|
    (over heads too, for ALiBi), a Python float; weights_past = the weights of the placement
    past train_len, in q's dtype, (W, W) ((num_heads, W, W) for ALiBi); both None where the
    scheme raised. ValueError if W > train_len or offset + W <= train_len. An extension of the
    contract: the lab's comparison, in code.
    """
    # TODO(Lab 7): weights(scores) = torch.softmax(scores, dim=-1); compare the two placements with (a - b).abs().max().
    # TODO(Lab 7): sinusoidal: lab 3's sin/cos of position * base ** (-2i / d_head) for just these positions.
    # TODO(Lab 7): learned: torch.nn.Embedding(train_len, d_head) looked up at positions >= train_len raises IndexError: catch it.
    # TODO(Lab 7): ALiBi needs only the distances p_i - p_j: the same numbers at both placements.
    # TODO(Lab 7): report the weights past train_len themselves too ("weights_past"): the grader compares them with its own.
    raise NotImplementedError("Lab 7: extrapolation_comparison")
