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
    # BEGIN SOLUTION
    # hint: a rotation needs pairs of features: refuse an odd d_head with a ValueError that says so.
    # hint: the exponents are the even feature indices 2i = 0, 2, 4, ... over d_head (torch.arange(0, d_head, 2)).
    if d_head % 2 != 0:
        raise ValueError(f"d_head must be even (RoPE rotates pairs of features), got {d_head}")
    two_i = torch.arange(0, d_head, 2, dtype=torch.float64)   # 0, 2, 4, ..., d_head - 2
    # float64 first, then the requested dtype: the best float32 theta there is.
    return torch.pow(float(base), -two_i / d_head).to(dtype)  # (d_head // 2,)
    # END SOLUTION


def apply_rope(x, positions, base=10000.0):
    """Rotary position embedding (RoFormer): x (..., T, d_head), positions long (T,) or
    broadcastable to (..., T). Each interleaved pair (x[..., 2i], x[..., 2i+1]) is rotated
    by the angle positions * theta_i:
        out[2i]   = x[2i] cos - x[2i+1] sin,   out[2i+1] = x[2i] sin + x[2i+1] cos.
    (The 'rotate-half' pairing (i, i + d_head/2) of some libraries is a different convention.)
    """
    # BEGIN SOLUTION
    # hint: angles = positions (as x's dtype) times theta: (..., T, 1) * (d_head // 2,) -> (..., T, d_head // 2).
    # hint: the pairs are the even and the odd features: x[..., 0::2] and x[..., 1::2].
    # hint: put the rotated pairs back interleaved (torch.stack on a new last axis, then flatten).
    theta = rope_frequencies(x.size(-1), base, dtype=x.dtype)        # (d_head // 2,)
    angles = positions.to(x.dtype).unsqueeze(-1) * theta             # (..., T, d_head // 2)
    cos, sin = torch.cos(angles), torch.sin(angles)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]                       # (..., T, d_head // 2) each
    rotated = torch.stack((x_even * cos - x_odd * sin,               # out[2i]
                           x_even * sin + x_odd * cos), dim=-1)      # out[2i + 1]
    return rotated.flatten(-2)                                       # (..., T, d_head)
    # END SOLUTION


def rope_scores(q, k, q_positions, k_positions, base=10000.0):
    """apply_rope(q, q_positions) @ apply_rope(k, k_positions)^T / sqrt(d_head):
    (..., Tq, Tk); depends on positions only through q_position - k_position.
    """
    # BEGIN SOLUTION
    # hint: rotate the queries and the keys by their own positions, then the usual scaled dot product.
    q_rot = apply_rope(q, q_positions, base)                         # (..., Tq, d_head)
    k_rot = apply_rope(k, k_positions, base)                         # (..., Tk, d_head)
    return q_rot @ k_rot.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., Tq, Tk)
    # END SOLUTION


def alibi_slopes(num_heads):
    """float32 (num_heads,): for a power of two n, 2 ** (-8 * (h + 1) / n), h = 0..n-1; else
    the slopes of the closest smaller power of two m followed by every other slope of 2m
    (Press et al., 2022, as in their reference code), first num_heads - m of them.
    """
    # BEGIN SOLUTION
    # hint: for a power of two n the slopes are a geometric sequence: 2 ** (-8 / n) to the powers 1, 2, ..., n.
    # hint: otherwise: the slopes of m (the largest power of two below num_heads), then every other slope of 2m ([0::2]) until there are num_heads.
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")

    def powers(n):
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    m = 1 << (num_heads.bit_length() - 1)             # the largest power of two <= num_heads
    slopes = powers(m)
    if m < num_heads:                                 # the slopes of 2m that fall between those of m
        slopes += powers(2 * m)[0::2][: num_heads - m]
    return torch.tensor(slopes, dtype=torch.float32)  # (num_heads,)
    # END SOLUTION


def alibi_bias(num_heads, seq_q, seq_k):
    """float32 (num_heads, seq_q, seq_k): -slope_h * |i + seq_k - seq_q - j| (query i at
    absolute position i + seq_k - seq_q), added to the scores before the softmax.
    """
    # BEGIN SOLUTION
    # hint: query i sits at absolute position i + seq_k - seq_q (the last query meets the last key).
    # hint: distances |position_i - j| as a (seq_q, seq_k) table, times each head's slope: (num_heads, 1, 1).
    # hint: a penalty: the bias is minus the slope times the distance.
    query_pos = torch.arange(seq_q).unsqueeze(1) + (seq_k - seq_q)    # (seq_q, 1)
    key_pos = torch.arange(seq_k).unsqueeze(0)                        # (1, seq_k)
    distance = (query_pos - key_pos).abs().to(torch.float32)          # (seq_q, seq_k)
    return -alibi_slopes(num_heads).view(-1, 1, 1) * distance         # (num_heads, seq_q, seq_k)
    # END SOLUTION


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
    # BEGIN SOLUTION
    # hint: weights(scores) = torch.softmax(scores, dim=-1); compare the two placements with (a - b).abs().max().
    # hint: sinusoidal: lab 3's sin/cos of position * base ** (-2i / d_head) for just these positions.
    # hint: learned: torch.nn.Embedding(train_len, d_head) looked up at positions >= train_len raises IndexError: catch it.
    # hint: ALiBi needs only the distances p_i - p_j: the same numbers at both placements.
    # hint: report the weights past train_len themselves too ("weights_past"): the grader compares them with its own.
    width, d_head = q.shape
    if width > train_len:
        raise ValueError(f"the {width} tokens do not fit in train_len={train_len}")
    if offset + width <= train_len:
        raise ValueError(f"offset={offset}: positions up to {offset + width - 1} are not past "
                         f"train_len={train_len}")
    scale = 1.0 / math.sqrt(d_head)
    inside = torch.arange(width)                       # positions seen in training
    past = inside + offset                             # the same tokens, further out

    def sinusoidal(positions):
        two_i = torch.arange(0, d_head, 2, dtype=torch.float64)
        angles = positions.to(torch.float64).unsqueeze(1) * torch.pow(float(base), -two_i / d_head)
        pe = torch.stack((torch.sin(angles), torch.cos(angles)), dim=-1).flatten(-2)  # (W, d_head)
        pe = pe.to(q.dtype)
        return (q + pe) @ (k + pe).T * scale

    table = torch.nn.Embedding(train_len, d_head).to(q.dtype)

    def learned(positions):
        pe = table(positions)                          # IndexError past train_len
        return (q + pe) @ (k + pe).T * scale

    def rope(positions):
        return rope_scores(q, k, positions, positions, base)

    slopes = alibi_slopes(num_heads).to(q.dtype).view(-1, 1, 1)         # (H, 1, 1)

    def alibi(positions):
        distance = (positions.unsqueeze(1) - positions.unsqueeze(0)).abs().to(q.dtype)
        return q @ k.T * scale - slopes * distance                      # (H, W, W)

    changes = {}
    for name, scores in (("sinusoidal", sinusoidal), ("learned", learned),
                         ("rope", rope), ("alibi", alibi)):
        try:
            before = torch.softmax(scores(inside), dim=-1)
            after = torch.softmax(scores(past), dim=-1)
        except IndexError:
            changes[name] = {"raised": True, "max_weight_change": None, "weights_past": None}
            continue
        changes[name] = {"raised": False,
                         "max_weight_change": float((after - before).abs().max()),
                         "weights_past": after}                 # (W, W); (H, W, W) for ALiBi
    return changes
    # END SOLUTION
