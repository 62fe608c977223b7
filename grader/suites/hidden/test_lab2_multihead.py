"""Lab 2 hidden tests: cross-attention, mask shapes, all-blocked rows, bias=False, dropout,
permutation equivariance, gradients and float64 for split_heads / merge_heads / MultiHeadAttention."""

import torch
import torch.nn.functional as F
import pytest  # noqa: F401

from grader.engine.compare import assert_close, assert_true
from grader.suites._inputs import (
    mha_param_grads,
    mha_reference,
    mha_reference_outputs,
    mha_run64,
    mha_weights,
    permutation,
    randn,
    random_mask,
    tril_mask,
)

O_AXES = ("batch", "seq_q", "d_model")
W_AXES = ("batch", "heads", "seq_q", "seq_k")


def _mha(student, sd, d_model, heads, **kwargs):
    mha = student.module("MultiHeadAttention", d_model, heads, **kwargs)
    mha.load_state_dict(sd)
    return mha


def test_cross_attention_seq_q_differs_from_seq_k(student, tol, gen):
    """Cross-attention with distinct query, key and value tensors and seq_q != seq_k matches PyTorch."""
    d_model, heads = 16, 4
    sd = mha_weights(gen, d_model)
    query, key, value = randn(gen, 2, 3, d_model), randn(gen, 2, 7, d_model), randn(gen, 2, 7, d_model)
    out, w = _mha(student, sd, d_model, heads)(query, key, value)
    exp_out, exp_w = mha_reference_outputs(sd, d_model, heads, query, key, value)
    assert_close(w, exp_w, tol=tol, name="weights", axes=W_AXES)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)


def test_causal_mask_broadcasts_over_batch_and_heads(student, tol, gen):
    """A (seq, seq) causal mask broadcasts over batch and heads and matches PyTorch."""
    d_model, heads = 12, 3
    sd = mha_weights(gen, d_model)
    x = randn(gen, 2, 6, d_model)
    mask = tril_mask(6)
    out, w = _mha(student, sd, d_model, heads)(x, x, x, mask=mask)
    exp_out, exp_w = mha_reference_outputs(sd, d_model, heads, x, x, x, mask)
    assert_close(w, exp_w, tol=tol, name="weights", axes=W_AXES)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)


def test_per_head_mask_applies_to_matching_head(student, tol, gen):
    """A full (batch, heads, seq_q, seq_k) mask applies slice [b, h] to batch b, head h."""
    d_model, heads = 16, 4
    sd = mha_weights(gen, d_model)
    x = randn(gen, 2, 5, d_model)
    mask = random_mask(gen, 2, heads, 5, 5, p_true=0.5)
    out, w = _mha(student, sd, d_model, heads)(x, x, x, mask=mask)
    exp_out, exp_w = mha_reference_outputs(sd, d_model, heads, x, x, x, mask)
    assert_close(w, exp_w, tol=tol, name="weights", axes=W_AXES)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)


def test_all_blocked_row_gives_zero_weights_and_bias_output(student, tol, gen):
    """A query with every key blocked gets zero weights in every head; its output is out_proj(0) = out_proj.bias."""
    d_model, heads = 8, 2
    sd = mha_weights(gen, d_model)
    query, kv = randn(gen, 2, 4, d_model), randn(gen, 2, 5, d_model)
    mask = random_mask(gen, 2, 1, 4, 5)
    mask[1, 0, 2] = False
    out, w = _mha(student, sd, d_model, heads)(query, kv, kv, mask=mask)
    exp_out, exp_w = mha_reference_outputs(sd, d_model, heads, query, kv, kv, mask)
    assert_close(w, exp_w, tol=tol, name="weights", axes=W_AXES)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)


def test_head_count_must_divide_d_model(student, tol, gen):
    """MultiHeadAttention(10, 4) raises ValueError; d_model=12 works with 3 heads and with 6 heads."""
    with student.raises("ValueError"):
        student.module("MultiHeadAttention", 10, 4).state_dict()
    sd = mha_weights(gen, 12)
    x = randn(gen, 2, 5, 12)
    for heads in (3, 6):
        out, w = _mha(student, sd, 12, heads)(x, x, x)
        exp_out, exp_w = mha_reference_outputs(sd, 12, heads, x, x, x)
        assert_close(w, exp_w, tol=tol, name=f"weights with {heads} heads", axes=W_AXES)
        assert_close(out, exp_out, tol=tol, name=f"output with {heads} heads", axes=O_AXES)


def test_no_bias_matches_pytorch(student, tol, gen):
    """MultiHeadAttention(bias=False) has no bias parameters and matches nn.MultiheadAttention(bias=False)."""
    d_model, heads = 12, 2
    sd = mha_weights(gen, d_model, bias=False)
    x = randn(gen, 2, 5, d_model)
    out, w = _mha(student, sd, d_model, heads, bias=False)(x, x, x)
    exp_out, exp_w = mha_reference_outputs(sd, d_model, heads, x, x, x)
    assert_close(w, exp_w, tol=tol, name="weights", axes=W_AXES)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)


def test_dropout_only_in_training_mode(student, tol, gen):
    """dropout=0.3: eval mode matches PyTorch; train mode zeroes ~30% of the weights and rescales the rest."""
    d_model, heads, p = 8, 2, 0.3
    sd = mha_weights(gen, d_model)
    x = randn(gen, 4, 40, d_model)
    mha = _mha(student, sd, d_model, heads, dropout=p)
    mha.eval()
    out_e, w_e = mha(x, x, x)
    mha.train()
    out_t, w_t = mha(x, x, x)
    exp_out, exp_w = mha_reference_outputs(sd, d_model, heads, x, x, x)
    assert_close(w_e, exp_w, tol=tol, name="weights in eval mode", axes=W_AXES)
    assert_close(out_e, exp_out, tol=tol, name="output in eval mode", axes=O_AXES)
    assert_true(isinstance(w_t, torch.Tensor) and w_t.shape == exp_w.shape,
                "training weights must be a (batch, heads, seq_q, seq_k) tensor")
    dropped = w_t == 0
    frac = dropped.double().mean().item()
    assert_true(abs(frac - p) <= 0.03, f"dropout={p} in training zeroed a fraction {frac:.3f} of the weights (expected {p} +- 0.03)",
                hidden="training mode did not zero a fraction of about `dropout` of the attention weights")
    assert_close(w_t[~dropped], exp_w[~dropped] / (1 - p), tol=tol, name="surviving training weights (softmax / (1 - p))")
    # the returned (dropped-out) weights are the ones applied to the values
    x64 = x.double()
    v = F.linear(x64, sd["v_proj.weight"].double(), sd["v_proj.bias"].double())
    v = v.view(4, 40, heads, d_model // heads).transpose(1, 2)
    merged = (w_t.double() @ v).transpose(1, 2).reshape(4, 40, d_model)
    exp_out_t = F.linear(merged, sd["out_proj.weight"].double(), sd["out_proj.bias"].double()).float()
    assert_close(out_t, exp_out_t, tol=tol, name="training output (from the returned weights)", axes=O_AXES)


def test_self_attention_permutation_equivariant(student, tol, gen):
    """Permuting the positions of x permutes the output and both axes of the weights alike."""
    d_model, heads = 8, 2
    sd = mha_weights(gen, d_model)
    x = randn(gen, 2, 7, d_model)
    perm = permutation(gen, 7)
    mha = _mha(student, sd, d_model, heads)
    out, w = mha(x, x, x)
    xp = x[:, perm]
    out_p, w_p = mha(xp, xp, xp)
    exp_out, _ = mha_reference_outputs(sd, d_model, heads, x, x, x)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)
    assert_close(out_p, out[:, perm], tol=tol, name="output for permuted input", axes=O_AXES)
    assert_close(w_p, w[:, :, perm][:, :, :, perm], tol=tol, name="weights for permuted input", axes=W_AXES)


def test_gradients_match_pytorch(student, tol, gen):
    """Input and parameter gradients (through output and weights, with a mask) match nn.MultiheadAttention."""
    d_model, heads = 8, 2
    sd = mha_weights(gen, d_model)
    query, key, value = randn(gen, 2, 4, d_model), randn(gen, 2, 5, d_model), randn(gen, 2, 5, d_model)
    mask = random_mask(gen, 2, 1, 4, 5)
    g_out, g_w = randn(gen, 2, 4, d_model), randn(gen, 2, heads, 4, 5)
    mha = _mha(student, sd, d_model, heads)
    g = student.grad(mha, query, key, value, grad_outputs=(g_out, g_w), mask=mask)
    ref = mha_reference(sd, d_model, heads)
    leaves = [t.double().requires_grad_() for t in (query, key, value)]
    out64, w64 = mha_run64(ref, *leaves, mask)
    ((out64 * g_out.double()).sum() + (w64 * g_w.double()).sum()).backward()
    for name, got, leaf in zip(("query", "key", "value"), g.input_grads, leaves, strict=False):
        assert_close(got, leaf.grad.float(), tol=tol, name=f"gradient w.r.t. {name}")
    expected = mha_param_grads(ref)
    assert_true(set(g.param_grads) == set(expected),
                f"expected gradients for the parameters {sorted(expected)}, got {sorted(g.param_grads)}")
    for name, grad in expected.items():
        assert_close(g.param_grads[name], grad.float(), tol=tol, name=f"gradient w.r.t. {name}")


def test_split_and_merge_keep_float64(student, tol, gen):
    """split_heads and merge_heads keep float64 (and merge_heads undoes split_heads exactly)."""
    x = randn(gen, 2, 4, 6, dtype=torch.float64)
    heads = student.call("split_heads", x, 2)
    assert_close(heads, x.view(2, 4, 2, 3).transpose(1, 2), tol=tol, name="split_heads(x, 2)",
                 axes=("batch", "heads", "seq", "d_head"))
    merged = student.call("merge_heads", heads)
    assert_close(merged, x, tol=tol, name="merge_heads(split_heads(x, 2))", axes=("batch", "seq", "d_model"))


def test_float64_module_keeps_dtype(student, tol, gen):
    """A float64 MultiHeadAttention on float64 inputs returns float64 output and weights that match PyTorch."""
    d_model, heads = 12, 3
    sd = mha_weights(gen, d_model, dtype=torch.float64)
    x = randn(gen, 2, 5, d_model, dtype=torch.float64)
    mha = student.module("MultiHeadAttention", d_model, heads).to(torch.float64)
    mha.load_state_dict(sd)
    out, w = mha(x, x, x, mask=tril_mask(5))
    exp_out, exp_w = mha_reference_outputs(sd, d_model, heads, x, x, x, tril_mask(5))
    assert_close(w, exp_w, tol=tol, name="weights", axes=W_AXES)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)
