"""Lab 7 public tests: rotary position embedding (RoPE), ALiBi's slopes and biases, and the
extrapolation comparison.

Run them with `grader check <your folder>`.  The expected values come from the grader's own
code in float64: RoPE by complex numbers (each feature pair a complex number, rotated by
exp(j * position * theta_i)), ALiBi's slopes as Press et al.'s reference code writes them.
RoPE is also graded on its defining property: shift a query and its keys by the same amount,
even far beyond any table a model could hold, and the scores stay.
The grader runs more (hidden) tests: float64 at large positions, batched positions,
gradients, odd d_head, many head counts, more queries than keys, and the comparison far out.
"""

import torch
import pytest  # noqa: F401

from grader.engine.compare import assert_close
from grader.suites._inputs import (
    alibi_bias_reference,
    alibi_slopes_reference,
    check_extrapolation_report,
    randn,
    rope_frequencies_reference,
    rope_reference,
    rope_scores_reference,
)

X_AXES = ("batch", "heads", "seq", "d_head")
S_AXES = ("batch", "seq_q", "seq_k")
B_AXES = ("heads", "seq_q", "seq_k")


def test_rope_frequencies_formula(student, tol):
    """rope_frequencies(d_head) is theta_i = base ** (-2i / d_head), float32 by default: the
    exponent is the even feature index 2i over d_head."""
    for d_head, base in ((16, 10000.0), (6, 500.0)):
        got = student.call("rope_frequencies", d_head, base=base)
        assert_close(got, rope_frequencies_reference(d_head, base), tol=tol,
                     name=f"rope_frequencies({d_head}, base={base})", axes=("pair",))


def test_apply_rope_matches_reference(student, tol, gen):
    """apply_rope on (batch, heads, T, d_head) float32 inputs with positions (T,) that do not
    start at 0 equals the rotation of every interleaved pair by position * theta_i."""
    x = randn(gen, 2, 3, 7, 8, scale=2.0)
    positions = torch.arange(5, 12)
    got = student.call("apply_rope", x, positions)
    assert_close(got, rope_reference(x, positions), tol=tol, name="apply_rope(x, positions)",
                 axes=X_AXES)
    got = student.call("apply_rope", x, positions, base=100.0)
    assert_close(got, rope_reference(x, positions, 100.0), tol=tol,
                 name="apply_rope(x, positions, base=100)", axes=X_AXES)


def test_apply_rope_rotates_interleaved_pairs(student, tol):
    """A unit vector in feature 0 at position p comes out as (cos p, sin p) in features 0 and
    1 (pair 0, theta_0 = 1), and one in feature 2 as (cos p theta_1, sin p theta_1) in
    features 2 and 3: the pairs are (2i, 2i + 1), not (i, i + d_head / 2)."""
    x = torch.zeros(2, 3, 8)
    x[0, :, 0] = 1.0                           # pair 0, first feature
    x[1, :, 2] = 1.0                           # pair 1, first feature
    positions = torch.tensor([0, 1, 3])
    got = student.call("apply_rope", x, positions)
    assert_close(got, rope_reference(x, positions), tol=tol,
                 name="apply_rope of unit vectors", axes=("batch", "seq", "d_head"))


def test_rope_scores_shift_invariant_far_beyond_any_table(student, tol, gen):
    """rope_scores depends on positions only through q_position - k_position: shifting both
    by 1000 or by 1234567 (far past any table a model could hold) leaves every score as it
    was, in float64 (float32 angles at such positions keep only a few digits)."""
    d = torch.float64
    q, k = randn(gen, 2, 4, 8, dtype=d), randn(gen, 2, 6, 8, dtype=d)
    q_pos, k_pos = torch.tensor([5, 6, 7, 8]), torch.tensor([0, 2, 3, 5, 8, 13])
    base_scores = student.call("rope_scores", q, k, q_pos, k_pos)
    assert_close(base_scores, rope_scores_reference(q, k, q_pos, k_pos), tol=tol,
                 name="rope_scores (float64)", axes=S_AXES)
    for shift in (1000, 1234567):
        shifted = student.call("rope_scores", q, k, q_pos + shift, k_pos + shift)
        assert_close(shifted, base_scores, tol=tol,
                     name=f"rope_scores with both positions shifted by {shift}, against your "
                          "unshifted scores", axes=S_AXES)


def test_alibi_slopes_power_of_two_and_not(student, tol):
    """alibi_slopes(8) is 1/2, 1/4, ..., 1/256; for 6 and 12 heads the slopes of 4 and 8
    heads come first, then every other slope of 8 and 16 heads (Press et al.)."""
    for heads in (8, 6, 12):
        got = student.call("alibi_slopes", heads)
        assert_close(got, alibi_slopes_reference(heads), tol=tol,
                     name=f"alibi_slopes({heads})", axes=("head",))


def test_alibi_bias_matches_reference(student, tol):
    """alibi_bias(heads, seq_q, seq_k) is -slope_h * |i + seq_k - seq_q - j|: a penalty growing
    with distance, the queries being the last seq_q positions when seq_k > seq_q."""
    for heads, seq_q, seq_k in ((4, 5, 5), (4, 3, 7), (6, 1, 5)):
        got = student.call("alibi_bias", heads, seq_q, seq_k)
        assert_close(got, alibi_bias_reference(heads, seq_q, seq_k), tol=tol,
                     name=f"alibi_bias({heads}, {seq_q}, {seq_k})", axes=B_AXES)


def test_extrapolation_comparison_reports_each_scheme(student, tol, gen):
    """Eight tokens at positions 0..7 and again at 1000..1007, past a training length of 16:
    the learned table cannot look them up, the sinusoidal pattern moves, RoPE's and ALiBi's
    do not (float64)."""
    q, k = randn(gen, 8, 16, dtype=torch.float64), randn(gen, 8, 16, dtype=torch.float64)
    got = student.call("extrapolation_comparison", q, k, 16, 1000)
    check_extrapolation_report(got, q, k, 16, 1000, 4, tol)
