"""Lab 1 hidden tests: dtypes, cross-attention, broadcast masks, all-blocked rows, numerical
stability, dropout and gradients of scaled_dot_product_attention; rectangular causal masks."""

import torch
import torch.nn.functional as F
import pytest  # noqa: F401

from grader.engine.compare import assert_close, assert_true
from grader.suites._inputs import (
    attention_output64,
    attention_reference,
    attention_weights64,
    permutation,
    randn,
    random_mask,
    tril_mask,
)

W_AXES = ("batch", "seq_q", "seq_k")
O_AXES = ("batch", "seq_q", "d_v")
W4_AXES = ("batch", "heads", "seq_q", "seq_k")
O4_AXES = ("batch", "heads", "seq_q", "d_v")


def test_float64_dtype_kept(student, tol, gen):
    """float64 inputs give float64 output and weights that match PyTorch to float64 precision."""
    d = torch.float64
    q, k, v = randn(gen, 2, 5, 8, dtype=d), randn(gen, 2, 7, 8, dtype=d), randn(gen, 2, 7, 3, dtype=d)
    mask = random_mask(gen, 5, 7)
    out, w = student.call("scaled_dot_product_attention", q, k, v, mask=mask)
    exp_out, exp_w = attention_reference(q, k, v, mask)
    assert_close(w, exp_w, tol=tol, name="weights", axes=W_AXES)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)


def test_cross_attention_seq_q_differs_from_seq_k(student, tol, gen):
    """Cross-attention: seq_q != seq_k and d_v != d_k (the scale uses d_k)."""
    q, k, v = randn(gen, 2, 3, 16), randn(gen, 2, 7, 16), randn(gen, 2, 7, 5)
    out, w = student.call("scaled_dot_product_attention", q, k, v)
    exp_out, exp_w = attention_reference(q, k, v)
    assert_close(w, exp_w, tol=tol, name="weights", axes=W_AXES)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)


def test_key_padding_mask_broadcasts_over_heads_and_queries(student, tol, gen):
    """A (batch, 1, 1, seq_k) key-padding mask broadcasts over heads and queries of 4-D inputs."""
    q, k, v = randn(gen, 2, 3, 4, 8), randn(gen, 2, 3, 6, 8), randn(gen, 2, 3, 6, 4)
    lengths = torch.tensor([4, 6])
    mask = (torch.arange(6) < lengths[:, None]).view(2, 1, 1, 6)
    out, w = student.call("scaled_dot_product_attention", q, k, v, mask=mask)
    exp_out, exp_w = attention_reference(q, k, v, mask)
    assert_close(w, exp_w, tol=tol, name="weights", axes=W4_AXES)
    assert_true(bool((w[0, :, :, 4:] == 0).all()), "padded keys (mask False) must get exactly 0 weight")
    assert_close(out, exp_out, tol=tol, name="output", axes=O4_AXES)


def test_all_blocked_row_gives_zeros_not_nan(student, tol, gen):
    """A query whose keys are all blocked gets all-zero weights and an all-zero output row (no NaN)."""
    q, k, v = randn(gen, 2, 5, 8), randn(gen, 2, 6, 8), randn(gen, 2, 6, 4)
    mask = random_mask(gen, 2, 5, 6)
    mask[0, 1] = False
    mask[1, 3] = False
    out, w = student.call("scaled_dot_product_attention", q, k, v, mask=mask)
    exp_out, exp_w = attention_reference(q, k, v, mask)
    assert_close(w, exp_w, tol=tol, name="weights", axes=W_AXES)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)
    assert_true(bool((w[0, 1] == 0).all() and (out[0, 1] == 0).all()),
                "a query row with every key blocked must have exactly 0 weights and output")


def test_all_blocked_row_gradients_are_finite(student, tol, gen):
    """Gradients stay finite (and match PyTorch) when a query row has every key blocked."""
    q, k, v = randn(gen, 1, 4, 8), randn(gen, 1, 5, 8), randn(gen, 1, 5, 3)
    mask = random_mask(gen, 4, 5)
    mask[2] = False
    g_out = randn(gen, 1, 4, 3)
    g = student.grad("scaled_dot_product_attention", q, k, v, grad_outputs=(g_out, None), mask=mask)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    (attention_output64(*leaves, mask) * g_out.double()).sum().backward()
    for name, got, leaf in zip("qkv", g.input_grads, leaves, strict=False):
        assert_close(got, leaf.grad.float(), tol=tol, name=f"gradient w.r.t. {name}")


def test_large_scores_are_numerically_stable(student, tol, gen):
    """Very large scores (|q.k| in the hundreds) give a finite, correct softmax (no exp overflow)."""
    q, k, v = randn(gen, 2, 5, 8, scale=12.0), randn(gen, 2, 5, 8, scale=12.0), randn(gen, 2, 5, 4)
    out, w = student.call("scaled_dot_product_attention", q, k, v)
    exp_out, exp_w = attention_reference(q, k, v)
    assert_close(w, exp_w, tol=tol, name="weights", axes=W_AXES)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)


def test_self_attention_permutation_equivariant(student, tol, gen):
    """Self-attention (q = k = v = x): permuting the positions of x permutes output and weights alike."""
    x = randn(gen, 2, 7, 8)
    perm = permutation(gen, 7)
    out, w = student.call("scaled_dot_product_attention", x, x, x)
    out_p, w_p = student.call("scaled_dot_product_attention", x[:, perm], x[:, perm], x[:, perm])
    exp_out, exp_w = attention_reference(x, x, x)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)
    assert_close(out_p, out[:, perm], tol=tol, name="output for permuted input", axes=O_AXES)
    assert_close(w_p, w[:, perm][:, :, perm], tol=tol, name="weights for permuted input", axes=W_AXES)


def test_dropout_zeroes_fraction_p_and_rescales_survivors(student, tol, gen):
    """Training dropout (p=0.3) zeroes ~30% of the weights, scales the rest by 1/(1-p), output == weights @ v."""
    p = 0.3
    q, k, v = randn(gen, 4, 64, 8), randn(gen, 4, 64, 8), randn(gen, 4, 64, 8)
    out, w = student.call("scaled_dot_product_attention", q, k, v, dropout_p=p, training=True, seed=11)
    _, exp_w = attention_reference(q, k, v)
    assert_true(isinstance(w, torch.Tensor) and w.shape == exp_w.shape, "weights must be a (batch, seq_q, seq_k) tensor")
    dropped = w == 0
    frac = dropped.double().mean().item()
    assert_true(abs(frac - p) <= 0.03, f"dropout_p={p} zeroed a fraction {frac:.3f} of the weights (expected {p} +- 0.03)",
                hidden="the weights returned in training show no dropout: about dropout_p of them should be "
                       "zero (dropout acts on the weights themselves, those multiplied with v)")
    kept = ~dropped
    assert_close(w[kept], exp_w[kept] / (1 - p), tol=tol, name="surviving weights (expected softmax / (1 - p))")
    assert_close(out, (w.double() @ v.double()).float(), tol=tol, name="output (expected returned weights @ v)",
                 axes=O_AXES)


def test_dropout_same_seed_same_result_other_seed_differs(student, tol, gen):
    """Dropout draws from torch's RNG: the same seed repeats the result, another seed changes it."""
    q, k, v = randn(gen, 2, 8, 8), randn(gen, 2, 8, 8), randn(gen, 2, 8, 8)
    args = dict(dropout_p=0.5, training=True)
    out1, w1 = student.call("scaled_dot_product_attention", q, k, v, seed=5, **args)
    out2, w2 = student.call("scaled_dot_product_attention", q, k, v, seed=5, **args)
    out3, w3 = student.call("scaled_dot_product_attention", q, k, v, seed=6, **args)
    _, exp_w = attention_reference(q, k, v)
    kept = w1 != 0
    assert_close(w1[kept], exp_w[kept] * 2, tol=tol, name="surviving weights (expected softmax / (1 - 0.5))")
    assert_true(torch.equal(w1, w2) and torch.equal(out1, out2), "the same seed must give the same dropout")
    assert_true(not torch.equal(w1, w3), "a different seed must give different dropout (draw from torch's RNG)")


def test_gradients_match_pytorch(student, tol, gen):
    """Gradients w.r.t. q, k and v (through output and weights, with a mask) match PyTorch autograd."""
    q, k, v = randn(gen, 2, 5, 8), randn(gen, 2, 6, 8), randn(gen, 2, 6, 4)
    mask = random_mask(gen, 5, 6)
    g_out, g_w = randn(gen, 2, 5, 4), randn(gen, 2, 5, 6)
    g = student.grad("scaled_dot_product_attention", q, k, v, grad_outputs=(g_out, g_w), mask=mask)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    out64 = F.scaled_dot_product_attention(*leaves, attn_mask=mask)
    w64 = attention_weights64(leaves[0], leaves[1], mask)
    ((out64 * g_out.double()).sum() + (w64 * g_w.double()).sum()).backward()
    for name, got, leaf in zip("qkv", g.input_grads, leaves, strict=False):
        assert_close(got, leaf.grad.float(), tol=tol, name=f"gradient w.r.t. {name}")


def test_causal_mask_more_keys_than_queries(student, tol):
    """causal_mask(seq_q, seq_k) with seq_k > seq_q: queries are the last seq_q positions."""
    got = student.call("causal_mask", 3, 7)
    assert_close(got, tril_mask(3, 7), tol=tol, name="causal_mask(3, 7)", axes=("seq_q", "seq_k"))
