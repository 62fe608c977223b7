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
    # BEGIN SOLUTION
    # hint: n matrices of L * L elements of b bytes take n * L^2 * b bytes; solve for L.
    # hint: use integer arithmetic (math.isqrt): a float square root can be one off.
    return math.isqrt(int(budget_bytes) // (int(bytes_per_element) * int(batch_heads)))
    # END SOLUTION


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
    # BEGIN SOLUTION
    # hint: keep per query a running max m (start at -inf), a running sum l and a running output acc (zeros).
    # hint: for each key chunk: scores (..., Lq, chunk); m_new = max(m, chunk max); rescale l and acc by exp(m - m_new).
    # hint: build each chunk's mask from index ranges (torch.arange of the queries and of the chunk's keys).
    # hint: a row whose keys are all blocked has m = -inf: subtract 0 there instead, and divide by l only where l > 0.
    lq, lk = q.size(-2), k.size(-2)
    scale = 1.0 / math.sqrt(q.size(-1))
    offset = lk - lq                                     # query i sits at position i + offset
    rows = torch.arange(lq, device=q.device).unsqueeze(1)          # (Lq, 1)
    stats_shape = q.shape[:-1] + (1,)                    # (..., Lq, 1)
    m = torch.full(stats_shape, float("-inf"), dtype=q.dtype, device=q.device)
    l = torch.zeros(stats_shape, dtype=q.dtype, device=q.device)
    acc = torch.zeros(q.shape[:-1] + (v.size(-1),), dtype=q.dtype, device=q.device)  # (..., Lq, dv)
    for start in range(0, lk, chunk_size):
        stop = min(start + chunk_size, lk)
        scores = q @ k[..., start:stop, :].transpose(-2, -1) * scale   # (..., Lq, c)
        allowed = None
        if causal:
            cols = torch.arange(start, stop, device=q.device).unsqueeze(0)  # (1, c)
            allowed = cols <= rows + offset                                 # (Lq, c)
        if key_padding_mask is not None:
            pad = key_padding_mask
            if pad.size(-1) != 1:
                pad = pad[..., start:stop]                                  # (..., 1, c)
            allowed = pad if allowed is None else allowed & pad
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        # The result does not depend on m (it cancels), so no gradient needs to flow through it.
        m_new = torch.maximum(m, scores.detach().amax(dim=-1, keepdim=True))  # (..., Lq, 1)
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # rows with no key yet
        alpha = torch.exp(m - m_safe)                    # rescales what came before: exp(m_old - m_new)
        p = torch.exp(scores - m_safe)                   # (..., Lq, c); blocked keys give exactly 0
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ v[..., start:stop, :]    # (..., Lq, dv)
        m = m_new
    # Rows that saw no allowed key have l == 0 and acc == 0: divide by 1 there (zeros, no NaN).
    return acc / torch.where(l > 0, l, torch.ones_like(l))
    # END SOLUTION


def sliding_window_mask(seq_len, window, device=None):
    """bool (seq_len, seq_len): True where i - window < j <= i (each query sees itself and
    the window - 1 keys before it).
    """
    # BEGIN SOLUTION
    # hint: compare a column of query indices i with a row of key indices j: two conditions, one band.
    i = torch.arange(seq_len, device=device).unsqueeze(1)  # (seq_len, 1)
    j = torch.arange(seq_len, device=device).unsqueeze(0)  # (1, seq_len)
    return (j <= i) & (j > i - window)  # (seq_len, seq_len)
    # END SOLUTION


def sliding_window_attention(q, k, v, window):
    """Self-attention (Lq == Lk == L) under sliding_window_mask, computed in O(L * window * d)
    time and memory (keys gathered per query block or unfolded), never an (L, L) tensor.
    ValueError if window < 1.
    q, k: (..., L, d), v: (..., L, dv) -> (..., L, dv).
    """
    # BEGIN SOLUTION
    # hint: raise ValueError for window < 1 before anything else.
    # hint: the queries of a block [s, e) need only the keys [s - window + 1, e): one slice of k and v.
    # hint: mask each block from index ranges (key j allowed when i - window < j <= i), then an ordinary softmax.
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    seq = q.size(-2)
    scale = 1.0 / math.sqrt(q.size(-1))
    block = min(seq, max(window, 16))                    # queries per block
    outputs = []
    for start in range(0, seq, block):
        stop = min(start + block, seq)
        first = max(0, start - window + 1)               # the first key any query of the block sees
        scores = q[..., start:stop, :] @ k[..., first:stop, :].transpose(-2, -1) * scale  # (..., b, w')
        i = torch.arange(start, stop, device=q.device).unsqueeze(1)   # (b, 1) absolute query positions
        j = torch.arange(first, stop, device=q.device).unsqueeze(0)   # (1, w') absolute key positions
        allowed = (j <= i) & (j > i - window)                          # (b, w'); each row sees itself
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        outputs.append(weights @ v[..., first:stop, :])  # (..., b, dv)
    return torch.cat(outputs, dim=-2)                    # (..., L, dv)
    # END SOLUTION


def elu_feature_map(x):
    """elu(x) + 1 (positive features; Katharopoulos et al., 2020)."""
    # BEGIN SOLUTION
    # hint: elu is in torch.nn.functional; the + 1 makes every feature strictly positive.
    return F.elu(x) + 1.0
    # END SOLUTION


def linear_attention(q, k, v, causal=False, eps=1e-6):
    """Kernel attention with phi = elu_feature_map in its associative O(L d dv) form:
    out_i = phi(q_i) S / (phi(q_i) . z + eps), with S = sum_j phi(k_j)^T v_j and
    z = sum_j phi(k_j) over all j (causal=False) or over j <= i (causal=True, prefix sums).
    q, k: (..., L, d), v: (..., L, dv) -> (..., L, dv); never an (L, L) tensor.
    """
    # BEGIN SOLUTION
    # hint: phi(q) (phi(k)^T v) instead of (phi(q) phi(k)^T) v: the (d, dv) state S is the same for every query.
    # hint: causal: S_i and z_i are prefix sums over j <= i (inclusive: query i sees key i), e.g. torch.cumsum.
    # hint: keep memory linear in L: carry S and z from one block of positions to the next.
    fq, fk = elu_feature_map(q), elu_feature_map(k)     # (..., L, d), positive
    if not causal:
        state = fk.transpose(-2, -1) @ v                 # S: (..., d, dv)
        z = fk.sum(dim=-2, keepdim=True)                 # (..., 1, d)
        num = fq @ state                                 # (..., L, dv)
        den = (fq * z).sum(dim=-1, keepdim=True)         # (..., L, 1)
        return num / (den + eps)
    block = 128                                          # positions per block: O(block * d * dv) memory
    state = torch.zeros(fk.shape[:-2] + (fk.size(-1), v.size(-1)), dtype=v.dtype, device=v.device)
    z = torch.zeros(fk.shape[:-2] + (fk.size(-1),), dtype=fk.dtype, device=fk.device)
    outputs = []
    for start in range(0, q.size(-2), block):
        stop = min(start + block, q.size(-2))
        fq_b, fk_b, v_b = fq[..., start:stop, :], fk[..., start:stop, :], v[..., start:stop, :]
        outer = fk_b.unsqueeze(-1) * v_b.unsqueeze(-2)   # phi(k_j)^T v_j: (..., b, d, dv)
        states = state.unsqueeze(-3) + outer.cumsum(dim=-3)        # inclusive prefix sums: (..., b, d, dv)
        zs = z.unsqueeze(-2) + fk_b.cumsum(dim=-2)                 # (..., b, d)
        num = (fq_b.unsqueeze(-2) @ states).squeeze(-2)            # (..., b, dv)
        den = (fq_b * zs).sum(dim=-1, keepdim=True)                # (..., b, 1)
        outputs.append(num / (den + eps))
        state, z = states[..., -1, :, :], zs[..., -1, :]           # carried to the next block
    return torch.cat(outputs, dim=-2)                    # (..., L, dv)
    # END SOLUTION


def linear_attention_quadratic(q, k, v, causal=False, eps=1e-6):
    """The same function in its O(L^2) form (weights_ij = phi(q_i).phi(k_j), normalised by
    their row sum + eps, causal rows masked): the check that the fast form is right.
    """
    # BEGIN SOLUTION
    # hint: weights = phi(q) @ phi(k)^T, (..., L, L); causal: zero the entries above the diagonal.
    # hint: divide each row by its sum + eps, then multiply with v.
    weights = elu_feature_map(q) @ elu_feature_map(k).transpose(-2, -1)  # (..., L, L)
    if causal:
        seq = q.size(-2)
        weights = weights.masked_fill(~torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril(), 0.0)
    return (weights / (weights.sum(dim=-1, keepdim=True) + eps)) @ v
    # END SOLUTION
