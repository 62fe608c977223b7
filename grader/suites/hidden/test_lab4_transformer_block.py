"""Lab 4 hidden tests: GELU blocks, arbitrary masks, dropout placement, default sizes and
gradients of FeedForward / TransformerBlock."""

import torch
import torch.nn.functional as F
import pytest  # noqa: F401

from grader.engine.compare import assert_close, assert_true
from grader.suites._inputs import (
    block_param_grads,
    block_reference,
    block_reference_output,
    block_run64,
    block_weights,
    randn,
    random_mask,
    tril_mask,
)

X_AXES = ("batch", "seq", "d_model")


def _block(student, sd, *args, **kwargs):
    block = student.module("TransformerBlock", *args, **kwargs)
    block.load_state_dict(sd)
    return block


def _check_gelu_block(student, tol, gen, norm_first):
    d_model, heads, d_ff = 16, 4, 48
    sd = block_weights(gen, d_model, d_ff)
    x = randn(gen, 2, 5, d_model)
    got = _block(student, sd, d_model, heads, d_ff, norm_first=norm_first, activation="gelu")(x)
    expected = block_reference_output(sd, d_model, heads, d_ff, x, norm_first=norm_first, activation="gelu")
    assert_close(got, expected, tol=tol, name="output", axes=X_AXES)


def test_post_norm_gelu_block_matches_pytorch(student, tol, gen):
    """A post-norm GELU block matches nn.TransformerEncoderLayer(activation="gelu")."""
    _check_gelu_block(student, tol, gen, norm_first=False)


def test_pre_norm_gelu_block_matches_pytorch(student, tol, gen):
    """A pre-norm GELU block matches nn.TransformerEncoderLayer(activation="gelu", norm_first=True)."""
    _check_gelu_block(student, tol, gen, norm_first=True)


def test_block_arbitrary_mask_matches_pytorch(student, tol, gen):
    """A non-causal (seq, seq) bool mask is applied as given (True = may attend), pre-norm."""
    d_model, heads, d_ff = 16, 4, 32
    sd = block_weights(gen, d_model, d_ff)
    x = randn(gen, 3, 7, d_model)
    mask = random_mask(gen, 7, 7, p_true=0.5)
    got = _block(student, sd, d_model, heads, d_ff, norm_first=True)(x, mask=mask)
    expected = block_reference_output(sd, d_model, heads, d_ff, x, mask, norm_first=True)
    assert_close(got, expected, tol=tol, name="output", axes=X_AXES)


def test_block_dropout_only_in_training(student, tol, gen):
    """dropout=0.3 has no effect in eval mode (matches PyTorch) and changes the output in training mode."""
    d_model, heads, d_ff = 16, 4, 32
    sd = block_weights(gen, d_model, d_ff)
    x = randn(gen, 2, 6, d_model)
    block = _block(student, sd, d_model, heads, d_ff, dropout=0.3)
    got_eval = block(x)
    block.train()
    got_train = block(x)
    expected = block_reference_output(sd, d_model, heads, d_ff, x)
    assert_close(got_eval, expected, tol=tol, name="output in eval mode", axes=X_AXES)
    assert_true(isinstance(got_train, torch.Tensor) and got_train.shape == x.shape,
                "the training output must be a (batch, seq, d_model) tensor")
    assert_true(bool(torch.isfinite(got_train).all()), "the training output must be finite")
    assert_true(bool((got_train - expected).abs().max() > 1e-2), "dropout must change the output in training mode")


def test_feedforward_dropout_after_activation_in_training(student, tol, gen):
    """FeedForward dropout sits between the activation and linear2: linear2(dropout(gelu(linear1(x))))."""
    d, p = 32, 0.5
    w1, b1 = randn(gen, d, d, scale=d ** -0.5), randn(gen, d, scale=0.3)
    b2 = randn(gen, d)
    sd = {"linear1.weight": w1, "linear1.bias": b1, "linear2.weight": torch.eye(d), "linear2.bias": b2}
    x = randn(gen, 16, 32, d)
    ff = student.module("FeedForward", d, d, dropout=p, activation="gelu")
    ff.load_state_dict(sd)
    ff.train()
    got = ff(x)
    hidden = F.gelu(F.linear(x.double(), w1.double(), b1.double())).float()
    assert_true(isinstance(got, torch.Tensor) and got.shape == x.shape, "the output must be a (batch, seq, d_model) tensor")
    # linear2 is the identity, so got - bias2 is the dropped-out hidden activation
    h = got - b2
    clear = hidden.abs() > 1e-3          # activations clearly distinguishable from a dropped 0
    dropped = (h.abs() <= 1e-6) & clear
    frac = (dropped.sum() / clear.sum()).item()
    assert_true(abs(frac - p) <= 0.03,
                f"dropout={p} zeroed a fraction {frac:.3f} of the hidden activations (expected {p} +- 0.03)",
                hidden="training dropout did not zero a fraction of about `dropout` of the hidden activations "
                       "(it belongs after the activation, before linear2)")
    kept = clear & ~dropped
    assert_close(h[kept], hidden[kept] / (1 - p), tol=tol,
                 name="surviving hidden activations (gelu(linear1(x)) / (1 - p))")


def test_block_default_sizes_match_pytorch(student, tol, gen):
    """TransformerBlock() with its defaults (d_model=64, 8 heads, d_ff=256, post-norm, relu) matches PyTorch."""
    sd = block_weights(gen, 64, 256)
    x = randn(gen, 2, 5, 64)
    got = _block(student, sd)(x)
    expected = block_reference_output(sd, 64, 8, 256, x)
    assert_close(got, expected, tol=tol, name="output", axes=X_AXES)


def _check_block_grads(student, tol, gen, norm_first, activation, mask):
    d_model, heads, d_ff = 8, 2, 16
    sd = block_weights(gen, d_model, d_ff)
    seq = mask.size(0)
    x, g_out = randn(gen, 2, seq, d_model), randn(gen, 2, seq, d_model)
    block = _block(student, sd, d_model, heads, d_ff, norm_first=norm_first, activation=activation)
    g = student.grad(block, x, grad_outputs=(g_out,), mask=mask)
    ref = block_reference(sd, d_model, heads, d_ff, norm_first, activation)
    x64 = x.double().requires_grad_()
    (block_run64(ref, x64, mask) * g_out.double()).sum().backward()
    assert_close(g.output, block_run64(ref, x.double(), mask).detach().float(), tol=tol, name="output",
                 axes=X_AXES)
    assert_close(g.input_grads[0], x64.grad.float(), tol=tol, name="gradient w.r.t. x", axes=X_AXES)
    expected = block_param_grads(ref)
    assert_true(set(g.param_grads) == set(expected),
                f"expected gradients for the parameters {sorted(expected)}, got {sorted(g.param_grads)}")
    for name, grad in expected.items():
        assert_close(g.param_grads[name], grad.float(), tol=tol, name=f"gradient w.r.t. {name}")


def test_block_post_norm_gradients_match_pytorch(student, tol, gen):
    """Post-norm ReLU block with a causal mask: gradients w.r.t. x and every parameter match PyTorch."""
    _check_block_grads(student, tol, gen, norm_first=False, activation="relu", mask=tril_mask(5))


def test_block_pre_norm_gradients_match_pytorch(student, tol, gen):
    """Pre-norm GELU block with an arbitrary mask: gradients w.r.t. x and every parameter match PyTorch."""
    _check_block_grads(student, tol, gen, norm_first=True, activation="gelu", mask=random_mask(gen, 5, 5))


def test_float64_block_keeps_dtype(student, tol, gen):
    """A float64 pre-norm TransformerBlock on float64 input returns float64 that matches PyTorch."""
    d_model, heads, d_ff = 8, 2, 16
    sd = {k: v.double() for k, v in block_weights(gen, d_model, d_ff).items()}
    x = randn(gen, 2, 5, d_model, dtype=torch.float64)
    block = student.module("TransformerBlock", d_model, heads, d_ff, norm_first=True)
    block.to(torch.float64).load_state_dict(sd)
    got = block(x, mask=tril_mask(5))
    expected = block_reference_output(sd, d_model, heads, d_ff, x, tril_mask(5), norm_first=True)
    assert_close(got, expected, tol=tol, name="output", axes=X_AXES)
