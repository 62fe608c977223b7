"""Lab 1 public tests: scaled dot-product attention and the causal mask.

Run them with `grader check <your folder>`.  The expected values come from PyTorch's own
torch.nn.functional.scaled_dot_product_attention (outputs) and from a float64 softmax
(weights).  The grader runs more (hidden) tests: float64 inputs, cross-attention, broadcast
masks, all-blocked rows, dropout and gradients.
"""

import torch
import torch.nn.functional as F  # noqa: F401  (the reference lives in grader.suites._inputs)
import pytest  # noqa: F401

from grader.engine.compare import assert_close, assert_true
from grader.suites._inputs import attention_reference, randn, random_mask, tril_mask

W_AXES = ("batch", "seq_q", "seq_k")
O_AXES = ("batch", "seq_q", "d_v")


def test_matches_pytorch_3d(student, tol, gen):
    """Output and weights match PyTorch for (batch, seq, d_k) float32 inputs without a mask."""
    q, k, v = randn(gen, 2, 6, 8), randn(gen, 2, 6, 8), randn(gen, 2, 6, 8)
    out, w = student.call("scaled_dot_product_attention", q, k, v)
    exp_out, exp_w = attention_reference(q, k, v)
    assert_close(w, exp_w, tol=tol, name="weights", axes=W_AXES)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)


def test_matches_pytorch_4d_heads(student, tol, gen):
    """Leading axes are batch axes: (batch, heads, seq, d_k) inputs match PyTorch."""
    q, k, v = randn(gen, 2, 3, 5, 4), randn(gen, 2, 3, 5, 4), randn(gen, 2, 3, 5, 4)
    out, w = student.call("scaled_dot_product_attention", q, k, v)
    exp_out, exp_w = attention_reference(q, k, v)
    assert_close(w, exp_w, tol=tol, name="weights", axes=("batch", "heads", "seq_q", "seq_k"))
    assert_close(out, exp_out, tol=tol, name="output", axes=("batch", "heads", "seq_q", "d_v"))


def test_bool_mask_blocks_keys(student, tol, gen):
    """A (seq_q, seq_k) bool mask (True = may attend) gives blocked keys exactly zero weight."""
    q, k, v = randn(gen, 2, 6, 8), randn(gen, 2, 6, 8), randn(gen, 2, 6, 8)
    mask = random_mask(gen, 6, 6, p_true=0.5)
    out, w = student.call("scaled_dot_product_attention", q, k, v, mask=mask)
    exp_out, exp_w = attention_reference(q, k, v, mask)
    assert_close(w, exp_w, tol=tol, name="weights", axes=W_AXES)
    assert_true(bool((w[:, ~mask] == 0).all()), "weights of blocked keys (mask False) must be exactly 0")
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)


def test_causal_mask_square(student, tol):
    """causal_mask(seq) is the bool lower triangle: True where key j <= query i."""
    got = student.call("causal_mask", 5)
    assert_close(got, tril_mask(5), tol=tol, name="causal_mask(5)", axes=("seq_q", "seq_k"))


def test_causal_attention_matches_pytorch(student, tol, gen):
    """With a lower-triangular mask, attention matches PyTorch's causal attention."""
    q, k, v = randn(gen, 2, 7, 8), randn(gen, 2, 7, 8), randn(gen, 2, 7, 4)
    mask = tril_mask(7)
    out, w = student.call("scaled_dot_product_attention", q, k, v, mask=mask)
    _, exp_w = attention_reference(q, k, v, mask)
    exp_out = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True).float()
    assert_close(w, exp_w, tol=tol, name="weights", axes=W_AXES)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)


def test_weights_rows_are_distributions_ordered_by_scores(student, tol, gen):
    """Each weight row sums to 1 over the allowed keys, is 0 elsewhere, and ranks keys like the scores."""
    q, k, v = randn(gen, 3, 6, 8, scale=1.5), randn(gen, 3, 9, 8), randn(gen, 3, 9, 5)
    mask = random_mask(gen, 3, 6, 9, p_true=0.7)
    _, w = student.call("scaled_dot_product_attention", q, k, v, mask=mask)
    assert_true(isinstance(w, torch.Tensor) and w.shape == mask.shape,
                f"weights: expected a tensor of shape (batch, seq_q, seq_k) = {tuple(mask.shape)}")
    assert_close(w.sum(-1), torch.ones(3, 6), tol=tol, name="sum of each weight row", axes=W_AXES[:2])
    assert_true(bool((w[~mask] == 0).all()), "weights of blocked keys (mask False) must be exactly 0")
    assert_true(bool((w[mask] > 0).all()), "every allowed key must get a positive weight")
    # softmax is strictly increasing: a clearly higher score must get a clearly higher weight
    scores = (q.double() @ k.double().transpose(-2, -1)).masked_fill(~mask, float("nan"))
    ds = scores.unsqueeze(-1) - scores.unsqueeze(-2)      # score_j - score_j'
    dw = w.double().unsqueeze(-1) - w.double().unsqueeze(-2)
    clearly = ds > 0.5
    assert_true(bool((dw[clearly] > 0).all()), "a key with a higher score must get a higher weight (softmax is monotone)")


def test_no_dropout_when_not_training(student, tol, gen):
    """dropout_p > 0 has no effect with training=False, and dropout_p=0 none with training=True."""
    q, k, v = randn(gen, 2, 5, 8), randn(gen, 2, 5, 8), randn(gen, 2, 5, 8)
    exp_out, exp_w = attention_reference(q, k, v)
    out, w = student.call("scaled_dot_product_attention", q, k, v, dropout_p=0.5, training=False)
    assert_close(w, exp_w, tol=tol, name="weights (dropout_p=0.5, training=False)", axes=W_AXES)
    assert_close(out, exp_out, tol=tol, name="output (dropout_p=0.5, training=False)", axes=O_AXES)
    out, w = student.call("scaled_dot_product_attention", q, k, v, dropout_p=0.0, training=True)
    assert_close(w, exp_w, tol=tol, name="weights (dropout_p=0, training=True)", axes=W_AXES)
    assert_close(out, exp_out, tol=tol, name="output (dropout_p=0, training=True)", axes=O_AXES)
