"""Lab 6 hidden tests: key-padding masks and all-blocked rows, float64 and (batch, heads)
inputs, very large scores and gradients of chunked_attention; edge windows and the window
check of sliding_window_attention; the causal prefix sums and eps of linear attention."""

import os

import torch
import torch.nn.functional as F
import pytest  # noqa: F401

from grader.engine.compare import (
    assert_close,
    assert_memory_grows_as,
    assert_memory_within,
    assert_true,
    assert_work_grows_within,
    assert_work_within_reference,
)
from grader.suites._inputs import (
    chunked_reference,
    lab6_mask,
    linear_reference,
    masked_attention64,
    padding_mask,
    randn,
    sliding_reference,
)

O_AXES = ("batch", "seq_q", "d_v")
O4_AXES = ("batch", "heads", "seq_q", "d_v")


def test_chunked_key_padding_mask_and_all_blocked_rows(student, tol, gen):
    """A (batch, 1, 1, Lk) key-padding mask broadcasts over heads and queries; a batch whose
    keys are all padded, and causal queries left with no real key, get zero rows (no NaN)."""
    q, k, v = randn(gen, 3, 2, 6, 8, scale=2.0), randn(gen, 3, 2, 9, 8, scale=2.0), randn(gen, 3, 2, 9, 4)
    pad = padding_mask([9, 0, 5], 9)      # batch 1: every key padded
    out = student.call("chunked_attention", q, k, v, key_padding_mask=pad, chunk_size=4)
    assert_close(out, chunked_reference(q, k, v, key_padding_mask=pad), tol=tol,
                 name="output (key_padding_mask)", axes=O4_AXES)
    assert_true(bool((out[1] == 0).all()), "a query whose keys are all padded must get an all-zero row")
    # causal with Lq > Lk: the first queries sit before every key and see none
    q2 = randn(gen, 3, 2, 12, 8, scale=2.0)
    out2 = student.call("chunked_attention", q2, k, v, causal=True, key_padding_mask=pad, chunk_size=2)
    assert_close(out2, chunked_reference(q2, k, v, causal=True, key_padding_mask=pad), tol=tol,
                 name="output (causal and key_padding_mask, Lq=12 > Lk=9)", axes=O4_AXES)


def test_chunked_float64_with_batch_and_heads(student, tol, gen):
    """float64 (batch, heads, L, d) inputs give a float64 output at float64 precision."""
    d = torch.float64
    q, k, v = (randn(gen, 2, 3, 10, 8, dtype=d), randn(gen, 2, 3, 10, 8, dtype=d),
               randn(gen, 2, 3, 10, 6, dtype=d))
    out = student.call("chunked_attention", q, k, v, causal=True, chunk_size=3)
    assert_close(out, chunked_reference(q, k, v, causal=True), tol=tol, name="output (float64)", axes=O4_AXES)


def test_chunked_large_scores_numerically_stable(student, tol, gen):
    """Scores in the hundreds, growing from chunk to chunk: the online softmax must subtract
    the running max (and rescale what came before), never exp() a raw score."""
    q = randn(gen, 2, 6, 8, scale=10.0)
    k = randn(gen, 2, 12, 8, scale=10.0) * torch.linspace(0.5, 3.0, 12).view(1, 12, 1)
    v = randn(gen, 2, 12, 4)
    out = student.call("chunked_attention", q, k, v, chunk_size=4)
    assert_close(out, chunked_reference(q, k, v), tol=tol, name="output (large scores)", axes=O_AXES)


def test_chunked_rows_of_very_negative_scores(student, tol, gen):
    """Rows whose scores are all far below zero (-200 to -400): the running max must start
    at -inf, so the first chunk's max is subtracted; a max that starts at 0 exp()s every
    score to 0 and leaves the row empty."""
    u = torch.rand(2, 1, 8, generator=gen) + 0.5
    q = (u * 20.0).expand(2, 6, 8) + randn(gen, 2, 6, 8, scale=0.5)
    k = -(u * 20.0).expand(2, 12, 8) * torch.linspace(0.7, 1.4, 12).view(1, 12, 1)
    v = randn(gen, 2, 12, 4)
    out = student.call("chunked_attention", q, k, v, chunk_size=4)
    assert_close(out, chunked_reference(q, k, v), tol=tol,
                 name="output (every score of a row below -200)", axes=O_AXES)


def test_chunked_gradients_match_full_attention(student, tol, gen):
    """Gradients w.r.t. q, k and v through chunked_attention (causal with Lq > Lk, padded keys,
    a first query with no key at all) match autograd through full attention, and stay finite."""
    q, k, v = randn(gen, 2, 8, 8), randn(gen, 2, 7, 8), randn(gen, 2, 7, 4)
    pad = padding_mask([7, 3], 7).view(2, 1, 7)
    g_out = randn(gen, 2, 8, 4)
    g = student.grad("chunked_attention", q, k, v, grad_outputs=g_out, causal=True,
                     key_padding_mask=pad, chunk_size=3)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    (masked_attention64(*leaves, lab6_mask(8, 7, True, pad)) * g_out.double()).sum().backward()
    for name, got, leaf in zip("qkv", g.input_grads, leaves, strict=False):
        assert_close(got, leaf.grad.float(), tol=tol, name=f"gradient w.r.t. {name}",
                     axes=("batch", "seq", "d"))


def test_sliding_window_edge_windows(student, tol, gen):
    """window=1 (each query sees only itself: the output is v) and window >= L (plain causal
    attention) both equal full attention under the band mask."""
    q, k, v = randn(gen, 2, 9, 8, scale=2.0), randn(gen, 2, 9, 8, scale=2.0), randn(gen, 2, 9, 4)
    for window in (1, 9, 20):
        out = student.call("sliding_window_attention", q, k, v, window)
        assert_close(out, sliding_reference(q, k, v, window), tol=tol,
                     name=f"output (window={window}, L=9)", axes=O_AXES)


def test_sliding_window_rejects_window_below_one(student, gen):
    """window < 1 leaves a query no key at all: sliding_window_attention raises ValueError."""
    q = randn(gen, 1, 4, 8)
    for window in (0, -2):
        with student.raises("ValueError"):
            student.call("sliding_window_attention", q, q, q, window)


def test_linear_attention_causal_prefix_sums(student, tol, gen):
    """Causal linear attention on (batch, heads) float64 inputs longer than one block: the
    fast form equals the student's own quadratic form and the kernel form (query i sees keys
    j <= i, itself included)."""
    d = torch.float64
    q, k, v = (randn(gen, 2, 2, 150, 4, dtype=d), randn(gen, 2, 2, 150, 4, dtype=d),
               randn(gen, 2, 2, 150, 3, dtype=d))
    fast = student.call("linear_attention", q, k, v, causal=True)
    slow = student.call("linear_attention_quadratic", q, k, v, causal=True)
    assert_close(fast, slow, tol=tol, name="linear_attention vs your linear_attention_quadratic",
                 axes=O4_AXES)
    assert_close(fast, linear_reference(q, k, v, causal=True), tol=tol,
                 name="linear_attention (causal, float64)", axes=O4_AXES)


def test_linear_attention_eps_respected(student, tol, gen):
    """eps is added to every denominator phi(q_i).z (fast and quadratic forms alike)."""
    q, k, v = randn(gen, 2, 7, 4), randn(gen, 2, 7, 4), randn(gen, 2, 7, 3)
    for causal in (False, True):
        exp = linear_reference(q, k, v, causal=causal, eps=5.0)
        fast = student.call("linear_attention", q, k, v, causal=causal, eps=5.0)
        assert_close(fast, exp, tol=tol, name=f"linear_attention (eps=5, causal={causal})", axes=O_AXES)
        slow = student.call("linear_attention_quadratic", q, k, v, causal=causal, eps=5.0)
        assert_close(slow, exp, tol=tol, name=f"linear_attention_quadratic (eps=5, causal={causal})",
                     axes=O_AXES)


# Linear work ~ L d^2, an (L, L) form ~ L^2 d plus L^2 exponentials at any d: a small d
# keeps the honest call cheap and the gap to an (L, L) form wide (rubric: the figures).
WORK_D = 16


def _causal_kernel_rows(q, k, v, rows, eps=1e-6):
    """Rows ``rows`` of causal elu+1 kernel attention, in float64 (each row from the keys up
    to it): a check of a long output at a few places without its (L, L) form."""
    fq = F.elu(q[..., rows, :].double()) + 1                       # (B, r, d)
    fk = F.elu(k.double()) + 1                                     # (B, L, d)
    w = fq @ fk.transpose(-2, -1)                                  # (B, r, L)
    w = w * (torch.arange(k.size(-2)) <= rows[:, None])            # key j <= query i
    return (w @ v.double()) / (w.sum(-1, keepdim=True) + eps)


SHORT, LONG = 2048, 16384     # 8x apart: linear work grows ~8x, an (L, L) product ~64x


def test_linear_attention_work_grows_linearly(student, tol, gen, budget):
    """Causal linear_attention does O(L) work: 8x the length costs about 8x the CPU time
    (measured by the grader from outside your code, after a warm-up call on other inputs
    of the same shapes), never the
    64x of an (L, L) product; and at L = 16384 it costs at most a few times what the
    course's reference costs on the same input, measured beside it."""
    q, k, v = (randn(gen, 1, SHORT, WORK_D, scale=0.5) for _ in range(3))
    short = student.measure("linear_attention", q, k, v, causal=True, warmup="alike")
    # every measured run's value: a cheap wrong answer says nothing
    assert_close(short.value, linear_reference(q, k, v, causal=True), tol=tol,
                 name=f"output at L={SHORT}", axes=("batch", "seq", "d_v"))
    q, k, v = (randn(gen, 1, LONG, WORK_D, scale=0.5) for _ in range(3))
    long = student.measure("linear_attention", q, k, v, causal=True, warmup="alike")
    assert_true(isinstance(long.value, torch.Tensor) and tuple(long.value.shape) == (1, LONG, WORK_D),
                f"output at L={LONG}: expected a (1, {LONG}, {WORK_D}) tensor",
                hidden=f"output at L={LONG}: a tensor of the input's shape (batch, seq, d_v) is due")
    # Rows drawn after the call, fresh every run: none can be left out unnoticed.
    rows = torch.randperm(LONG, generator=torch.Generator().manual_seed(
        int.from_bytes(os.urandom(8), "little")))[:64].sort().values
    assert_close(long.value[:, rows], _causal_kernel_rows(q, k, v, rows).float(), tol=tol,
                 name=f"output rows at L={LONG}", axes=("batch", "seq", "d_v"))
    assert_work_grows_within(short, long, budget,
                             name="linear_attention (causal)", factor=LONG // SHORT)
    # The yardstick: the course's reference on the same input, measured beside it. CPU
    # burnt at the short length moves the ratio above, never this bound.
    ref = student.measure("linear_attention", q, k, v, causal=True, warmup="alike",
                          reference=True)
    assert_work_within_reference(long, ref, budget, name="linear_attention (causal)",
                                 at=f"L={LONG}")


KEYS_LONG, QUERIES_FEW = 65536, 64


def test_chunked_memory_flat_in_the_number_of_keys(student, tol, gen, budget):
    """64 queries over 65,536 keys, chunk_size=128: the online softmax holds (64, 128)
    scores at a time whatever the number of keys; a plain softmax over all the keys (one
    block of queries at a time) holds (64, 65536) scores, 16 MB. Peak memory above the
    inputs, measured by the grader after a warm-up call on other inputs of the same shapes
    (memory it leaves held beyond 4 MB counts)."""
    q = randn(gen, 1, QUERIES_FEW, 16)
    k, v = randn(gen, 1, KEYS_LONG, 16), randn(gen, 1, KEYS_LONG, 16)
    m = student.measure("chunked_attention", q, k, v, chunk_size=128, warmup="alike")
    exp = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    assert_close(m.value, exp.float(), tol=tol,
                 name=f"output ({QUERIES_FEW} queries, {KEYS_LONG} keys)", axes=O_AXES)
    assert_memory_within(m, budget, name=f"chunked_attention ({QUERIES_FEW} queries over "
                         f"{KEYS_LONG} keys)", big_bytes=QUERIES_FEW * KEYS_LONG * 4,
                         big_what=f"the ({QUERIES_FEW}, {KEYS_LONG}) float32 score matrix")


# O(L * window * d) at window 16, d 8 is L * 128 numbers, an (L, L) matrix L * L: from 2048
# to 8192 positions the window's memory grows 4x and 6144 * 128 numbers, the matrix's 16x
# and 60 M numbers (240 MB in float32): far apart at both sizes (rubric: the figures).
WINDOW_LENGTHS, WINDOW, WINDOW_D = (2048, 8192), 16, 8


def _band_rows(q, k, v, rows, window):
    """Rows ``rows`` of sliding-window attention in float64, each from its own band of keys:
    a check of a long output at a few places without its (L, L) form."""
    out = []
    for i in rows.tolist():
        lo = max(0, i - window + 1)
        s = q[:, i:i + 1].double() @ k[:, lo:i + 1].double().transpose(-2, -1)
        out.append(torch.softmax(s / q.size(-1) ** 0.5, -1) @ v[:, lo:i + 1].double())
    return torch.cat(out, dim=1)


def test_sliding_window_memory_linear_in_length(student, tol, gen, budget):
    """sliding_window_attention at L = 2048 and 8192, window 16, d 8, holds O(L * window * d):
    from one length to the other its peak memory above the inputs may rise by at most the
    rubric's number of float64 values per (position, window slot, dim) added, and hold no
    more than that at 2048 (each measured by the grader in a fresh worker, after a warm-up
    call on other inputs of the same shapes). The (L, L) score matrix grows 16x, by 240 MB
    in float32; keys gathered per query, unfolded, or per block of queries grow 4x."""
    series = []
    for length in WINDOW_LENGTHS:
        q, k, v = (randn(gen, 1, length, WINDOW_D) for _ in range(3))
        m = student.measure("sliding_window_attention", q, k, v, WINDOW, warmup="alike")
        rows = torch.randperm(length, generator=torch.Generator().manual_seed(
            int.from_bytes(os.urandom(8), "little")))[:32].sort().values
        value = m.value
        if isinstance(value, torch.Tensor) and value.shape == (1, length, WINDOW_D):
            value = value[:, rows]
        assert_close(value, _band_rows(q, k, v, rows, WINDOW).float(), tol=tol,
                     name=f"output (32 rows drawn at random) at L={length}", axes=O_AXES)
        series.append((length, m))
    assert_memory_grows_as(
        series, budget, name=f"sliding_window_attention (window={WINDOW}, d={WINDOW_D})",
        elements=lambda n: n * WINDOW * WINDOW_D, o_text="L * window * d",
        big=lambda n: (n * n * 4, f"the ({n}, {n}) float32 score matrix"))
