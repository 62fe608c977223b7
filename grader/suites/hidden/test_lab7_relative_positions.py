"""Lab 7 hidden tests: RoPE in float64 at large, batched positions, its gradients, odd
d_head, rope_scores with batched positions far out; ALiBi's slopes for many head counts and
biases with more queries than keys; the extrapolation comparison far out and its checks."""

import torch
import pytest  # noqa: F401

from grader.engine.compare import assert_close
from grader.suites._inputs import (
    alibi_bias_reference,
    alibi_slopes_reference,
    check_extrapolation_report,
    randn,
    rope64,
    rope_frequencies_reference,
    rope_reference,
    rope_scores_reference,
)

X_AXES = ("batch", "heads", "seq", "d_head")


def test_apply_rope_float64_large_positions(student, tol, gen):
    """float64 inputs with positions near 10^5, one row of positions per batch element
    ((batch, 1, T), broadcast over heads): float64 out, at float64 accuracy."""
    x = randn(gen, 2, 3, 5, 8, dtype=torch.float64)
    positions = 100_000 + torch.randint(0, 50_000, (2, 1, 5), generator=gen)
    got = student.call("apply_rope", x, positions)
    assert_close(got, rope_reference(x, positions), tol=tol, name="apply_rope (float64, large positions)",
                 axes=X_AXES)


def test_apply_rope_gradients_rotate_back(student, tol, gen):
    """A rotation's gradient is the rotation back: the gradient w.r.t. x of
    sum(apply_rope(x, p) * g) is g rotated by -p * theta_i."""
    x, g = randn(gen, 2, 6, 8), randn(gen, 2, 6, 8)
    positions = torch.randint(0, 40, (6,), generator=gen)
    got = student.grad("apply_rope", x, positions, grad_outputs=g)
    assert_close(got.output, rope_reference(x, positions), tol=tol, name="apply_rope(x, positions)",
                 axes=("batch", "seq", "d_head"))
    assert_close(got.input_grads[0], rope64(g, -positions).float(), tol=tol,
                 name="gradient w.r.t. x", axes=("batch", "seq", "d_head"))


def test_rope_frequencies_odd_d_head_and_wide_heads(student, tol):
    """An odd d_head has a feature without a partner: ValueError. d_head = 128 (a common
    head size) gives 64 frequencies from 1 down to base ** (-126 / 128)."""
    for d_head in (7, 1):
        with student.raises("ValueError"):
            student.call("rope_frequencies", d_head)
    got = student.call("rope_frequencies", 128)
    assert_close(got, rope_frequencies_reference(128), tol=tol, name="rope_frequencies(128)",
                 axes=("pair",))


def test_rope_scores_batched_positions_far_out(student, tol, gen):
    """rope_scores with (batch, heads) float64 inputs, Tq != Tk and positions per batch
    element around 10^6, equal to the reference at those positions."""
    d = torch.float64
    q, k = randn(gen, 2, 3, 4, 8, dtype=d), randn(gen, 2, 3, 7, 8, dtype=d)
    start = 1_000_000 + torch.randint(0, 1000, (2, 1, 1), generator=gen)
    q_pos = start + torch.tensor([3, 4, 5, 6])
    k_pos = start + torch.randint(0, 10, (2, 1, 7), generator=gen)
    got = student.call("rope_scores", q, k, q_pos, k_pos)
    assert_close(got, rope_scores_reference(q, k, q_pos, k_pos), tol=tol,
                 name="rope_scores (float64, batched positions near 10^6)",
                 axes=("batch", "heads", "seq_q", "seq_k"))


def draw(gen, low, high):
    """An int in [low, high), drawn from the test's (course-secret-seeded) generator."""
    return int(torch.randint(low, high, (1,), generator=gen))


def test_alibi_slopes_many_head_counts(student, tol, gen):
    """Slopes for 1, 2 and 3 heads and for head counts drawn up to 40: powers of two and
    the interleaved rest."""
    for heads in (1, 2, 3, draw(gen, 5, 8), draw(gen, 9, 16), draw(gen, 17, 40)):
        got = student.call("alibi_slopes", heads)
        assert_close(got, alibi_slopes_reference(heads), tol=tol, name=f"alibi_slopes({heads})",
                     axes=("head",))


def test_alibi_bias_more_queries_than_keys(student, tol, gen):
    """seq_q > seq_k puts the first queries before every key (position i + seq_k - seq_q < 0:
    the distance still counts); one query over one key has bias 0."""
    many = draw(gen, 5, 10)                  # queries, over fewer keys
    for heads, seq_q, seq_k in ((draw(gen, 3, 13), many, draw(gen, 2, many)), (2, 1, 1),
                                (draw(gen, 3, 13), 2, draw(gen, 6, 13))):
        got = student.call("alibi_bias", heads, seq_q, seq_k)
        assert_close(got, alibi_bias_reference(heads, seq_q, seq_k), tol=tol,
                     name=f"alibi_bias({heads}, {seq_q}, {seq_k})", axes=("heads", "seq_q", "seq_k"))


def test_extrapolation_comparison_far_out_and_checks(student, tol, gen):
    """Six tokens moved about 10^5 positions past a training length of 32, six ALiBi heads;
    a window that does not reach past train_len, or does not fit in it, is a ValueError."""
    q, k = randn(gen, 6, 12, dtype=torch.float64), randn(gen, 6, 12, dtype=torch.float64)
    offset = 100_000 + draw(gen, 0, 1000)
    got = student.call("extrapolation_comparison", q, k, 32, offset, num_heads=6)
    check_extrapolation_report(got, q, k, 32, offset, 6, tol)
    for train_len, offset in ((32, 26), (4, 100)):      # 26 + 6 <= 32; 6 tokens > 4
        with student.raises("ValueError"):
            student.call("extrapolation_comparison", q, k, train_len, offset)
