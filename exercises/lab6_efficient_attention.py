# Generated from solutions/lab6_efficient_attention.py by `grader stubs`. Fill in the TODOs; keep the given code.
"""Lab 6 -- the quadratic wall: chunked, sliding-window and linear attention.

Full attention builds the score matrix S = Q K^T / sqrt(d): one number for every (query, key)
pair.  For a sequence of length L that is L^2 numbers per batch element and head, so the
memory grows with the *square* of the length while the inputs grow only linearly:

    L = 4096,  float32:  4096^2 * 4 bytes =  64 MiB   per (batch, head)
    L = 8192,  float32:  8192^2 * 4 bytes = 256 MiB   per (batch, head)
    batch 8 x 16 heads at L = 8192:                     32 GiB

The inputs Q, K, V of that last example (d = 64) take 3 * 8 * 16 * 8192 * 64 * 4 bytes =
768 MiB.  The score matrix, not the model, is the wall.  The written question of this lab:
*at which L does full attention's score matrix stop fitting in a memory budget M?*  With
n = batch * heads matrices of L^2 elements of b bytes each, it fits while n * L^2 * b <= M,
so the largest length is L_max = floor(sqrt(M / (n * b))) and L_max + 1 no longer fits
(``score_matrix_max_len`` below answers it in code; e.g. 16 GiB for 8 x 16 float32 heads
gives L_max = 5792).  Three ways around the wall:

1. Exact, but streamed: chunked attention with an online softmax.  The output of query i is
   sum_j exp(s_ij) v_j / sum_j exp(s_ij); both sums can be accumulated over blocks of keys,
   one block at a time, if we keep per query a running max m (for numerical stability), a
   running denominator l and a running numerator acc.  When a new block raises the max from
   m_old to m_new, everything accumulated so far was computed relative to m_old and is
   rescaled by exp(m_old - m_new):

       m_new = max(m_old, max_j s_ij)                 (j in the new block)
       p_ij  = exp(s_ij - m_new)
       l     = l   * exp(m_old - m_new) + sum_j p_ij
       acc   = acc * exp(m_old - m_new) + sum_j p_ij v_j
       out_i = acc / l                                (after the last block)

   Only an (Lq, chunk) block of scores exists at any time: O(L * chunk) memory instead of
   O(L^2), the same result up to rounding.  This is the idea behind memory-efficient and
   FlashAttention kernels (which also recompute the blocks in the backward pass instead of
   storing them).  Masks are built per block from index ranges, never as an (Lq, Lk) table.

       for start in range(0, Lk, chunk):
           s = q @ k[start:start + chunk].T / sqrt(d)          # (Lq, chunk)
           m_new = max(m, s.max(-1)); alpha = exp(m - m_new)
           p = exp(s - m_new); l = l * alpha + p.sum(-1); acc = acc * alpha + p @ v_block

2. Sparse: sliding-window (local) attention.  Query i sees only keys i - w < j <= i, itself
   and the w - 1 before it.  A band of width w: O(L w) scores instead of L^2.  Computed per
   block of queries, whose keys are one slice of the sequence, it never touches the zeros
   outside the band.  Stacked layers still pass information further than w.

3. A linear approximation: kernel (linear) attention (Katharopoulos et al., 2020).  Replace
   exp(q . k) by a product of positive features phi(q) . phi(k), phi(x) = elu(x) + 1 > 0.
   Then, by associativity,

       out_i = sum_j (phi(q_i) . phi(k_j)) v_j / sum_j phi(q_i) . phi(k_j)
             = phi(q_i) S / (phi(q_i) . z),    S = sum_j phi(k_j)^T v_j  (d x dv),
                                               z = sum_j phi(k_j)        (d,)

   (phi(Q) phi(K)^T) V costs O(L^2 d); phi(Q) (phi(K)^T V) costs O(L d dv): linear in L.
   Causal: S and z become prefix sums over j <= i (query i sees key i too), carried as a
   running state, exactly the state an RNN would carry.  It is a different function from
   softmax attention (that is the approximation), but its fast and quadratic forms agree.
   The features must be positive: with elu alone (or relu) the denominators can be zero or
   negative and the "weights" are no longer a distribution.

Masks follow the course convention: True = may attend; causal alignment as in lab 1 (the
last query sees the last key: query i sees keys j <= i + Lk - Lq); a query with no allowed
key gets a zero output row, not NaN.
"""

import math

import torch
import torch.nn.functional as F


def score_matrix_max_len(budget_bytes, bytes_per_element=4, batch_heads=1):
    """The largest L whose full score matrices fit in budget_bytes: batch_heads matrices of
    L x L elements of bytes_per_element bytes each (4 for float32, 8 for float64), so
    batch_heads * L^2 * bytes_per_element <= budget_bytes while L + 1 no longer fits.
    Returns a Python int. An extension of the contract: the lab's written question, answered
    in code.
    """
    # TODO(Lab 6): n matrices of L * L elements of b bytes take n * L^2 * b bytes; solve for L.
    # TODO(Lab 6): use integer arithmetic (math.isqrt): a float square root can be one off.
    raise NotImplementedError("Lab 6: score_matrix_max_len")


def chunked_attention(q, k, v, causal=False, key_padding_mask=None, chunk_size=128):
    """q: (..., Lq, d), k: (..., Lk, d), v: (..., Lk, dv) -> output (..., Lq, dv), equal
    to softmax(q k^T / sqrt(d)) v with the masks below, computed over key chunks of
    chunk_size with an online softmax (a running max and sum per query, earlier partial
    sums rescaled when the max grows). Never builds an (Lq, Lk) tensor for all keys at
    once: the extra memory is O(Lq * chunk_size) per leading index.
    causal: query i sees keys j <= i + Lk - Lq. key_padding_mask: bool broadcastable to
    (..., 1, Lk) (e.g. (B, 1, 1, Lk) for (B, H, L, d) inputs), True = a real key. A query
    with no allowed key gets a zero row (no NaN). "Never an (Lq, Lk) tensor" means of any
    dtype, bool masks included.
    """
    # TODO(Lab 6): keep per query a running max m (start at -inf), a running sum l and a running output acc (zeros).
    # TODO(Lab 6): for each key chunk: scores (..., Lq, chunk); m_new = max(m, chunk max); rescale l and acc by exp(m - m_new).
    # TODO(Lab 6): build each chunk's mask from index ranges (torch.arange of the queries and of the chunk's keys).
    # TODO(Lab 6): a row whose keys are all blocked has m = -inf: subtract 0 there instead, and divide by l only where l > 0.
    raise NotImplementedError("Lab 6: chunked_attention")


def sliding_window_mask(seq_len, window, device=None):
    """bool (seq_len, seq_len): True where i - window < j <= i (each query sees itself and
    the window - 1 keys before it).
    """
    # TODO(Lab 6): compare a column of query indices i with a row of key indices j: two conditions, one band.
    raise NotImplementedError("Lab 6: sliding_window_mask")


def sliding_window_attention(q, k, v, window):
    """Self-attention (Lq == Lk == L) under sliding_window_mask, computed in O(L * window * d)
    time and memory (keys gathered per query block or unfolded), never an (L, L) tensor.
    ValueError if window < 1.
    q, k: (..., L, d), v: (..., L, dv) -> (..., L, dv).
    """
    # TODO(Lab 6): raise ValueError for window < 1 before anything else.
    # TODO(Lab 6): the queries of a block [s, e) need only the keys [s - window + 1, e): one slice of k and v.
    # TODO(Lab 6): mask each block from index ranges (key j allowed when i - window < j <= i), then an ordinary softmax.
    raise NotImplementedError("Lab 6: sliding_window_attention")


def elu_feature_map(x):
    """elu(x) + 1 (positive features; Katharopoulos et al., 2020)."""
    # TODO(Lab 6): elu is in torch.nn.functional; the + 1 makes every feature strictly positive.
    raise NotImplementedError("Lab 6: elu_feature_map")


def linear_attention(q, k, v, causal=False, eps=1e-6):
    """Kernel attention with phi = elu_feature_map in its associative O(L d dv) form:
    out_i = phi(q_i) S / (phi(q_i) . z + eps), with S = sum_j phi(k_j)^T v_j and
    z = sum_j phi(k_j) over all j (causal=False) or over j <= i (causal=True, prefix sums).
    q, k: (..., L, d), v: (..., L, dv) -> (..., L, dv); never an (L, L) tensor.
    """
    # TODO(Lab 6): phi(q) (phi(k)^T v) instead of (phi(q) phi(k)^T) v: the (d, dv) state S is the same for every query.
    # TODO(Lab 6): causal: S_i and z_i are prefix sums over j <= i (inclusive: query i sees key i), e.g. torch.cumsum.
    # TODO(Lab 6): keep memory linear in L: carry S and z from one block of positions to the next.
    raise NotImplementedError("Lab 6: linear_attention")


def linear_attention_quadratic(q, k, v, causal=False, eps=1e-6):
    """The same function in its O(L^2) form (weights_ij = phi(q_i).phi(k_j), normalised by
    their row sum + eps, causal rows masked): the check that the fast form is right.
    """
    # TODO(Lab 6): weights = phi(q) @ phi(k)^T, (..., L, L); causal: zero the entries above the diagonal.
    # TODO(Lab 6): divide each row by its sum + eps, then multiply with v.
    raise NotImplementedError("Lab 6: linear_attention_quadratic")
