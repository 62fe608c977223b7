"""Lab 3 hidden tests: odd d_model, custom base, long tables, default max_len, pe as a buffer,
float64 inputs, seq == max_len, gradients and dropout of the positional encodings."""

import torch
import torch.nn.functional as F  # noqa: F401
import pytest  # noqa: F401

from grader.engine.compare import assert_close, assert_true
from grader.engine.reference import load_reference
from grader.suites._inputs import randn, sinusoidal64

X_AXES = ("batch", "seq", "d_model")
PE_AXES = ("position", "feature")


def test_sinusoidal_odd_d_model_keeps_last_sin_column(student, tol):
    """With an odd d_model (7) the last column is a sine (4 sine columns, 3 cosine columns)."""
    got = student.call("sinusoidal_positional_encoding", 9, 7)
    assert_close(got, sinusoidal64(9, 7).float(), tol=tol, name="sinusoidal_positional_encoding(9, 7)",
                 axes=PE_AXES)


def test_sinusoidal_custom_base(student, tol):
    """The base argument replaces 10000: sinusoidal_positional_encoding(10, 8, base=100.0)."""
    got = student.call("sinusoidal_positional_encoding", 10, 8, base=100.0)
    assert_close(got, sinusoidal64(10, 8, base=100.0).float(), tol=tol,
                 name="sinusoidal_positional_encoding(10, 8, base=100.0)", axes=PE_AXES)


def test_sinusoidal_long_table_matches_reference(student, tol):
    """A long table (1000 positions, d_model 64) matches the formula and the reference solution."""
    ref = load_reference("lab3_positional")
    got = student.call("sinusoidal_positional_encoding", 1000, 64)
    assert_close(got, sinusoidal64(1000, 64).float(), tol=tol, name="table vs the float64 formula", axes=PE_AXES)
    assert_close(got, ref.sinusoidal_positional_encoding(1000, 64), tol=tol, name="table vs the reference",
                 axes=PE_AXES)


def test_default_max_len_is_5000(student, tol):
    """SinusoidalPositionalEncoding(8) precomputes a (5000, 8) table by default."""
    pe = student.module("SinusoidalPositionalEncoding", 8).buffer("pe")
    assert_close(pe, sinusoidal64(5000, 8).float(), tol=tol, name='buffer "pe"', axes=PE_AXES)


def test_pe_is_a_buffer_not_a_parameter(student, tol, gen):
    """The sinusoidal table gets no gradient (no trainable parameters); the input's gradient passes through."""
    x, g_out = randn(gen, 2, 5, 8), randn(gen, 2, 5, 8)
    pos = student.module("SinusoidalPositionalEncoding", 8, max_len=20)
    g = student.grad(pos, x, grad_outputs=(g_out,))
    assert_true(g.param_grads == {}, (
        f"SinusoidalPositionalEncoding must have no trainable parameters, but got gradients for "
        f"{sorted(g.param_grads)} (register pe with register_buffer, not nn.Parameter)"))
    assert_close(g.output, x + sinusoidal64(5, 8).float(), tol=tol, name="output", axes=X_AXES)
    assert_close(g.input_grads[0], g_out, tol=tol, name="gradient w.r.t. x", axes=X_AXES)


def test_sinusoidal_module_float64_input_keeps_dtype(student, tol, gen):
    """A float64 input gives a float64 output x + pe[:seq]."""
    ref = load_reference("lab3_positional")
    x = randn(gen, 2, 6, 8, dtype=torch.float64)
    got = student.module("SinusoidalPositionalEncoding", 8, max_len=16)(x)
    expected = x + ref.sinusoidal_positional_encoding(16, 8)[:6].double()
    assert_close(got, expected, tol=tol, name="output", axes=X_AXES)


def test_learned_embedding_float64_input_keeps_dtype(student, tol, gen):
    """A float64 input gives a float64 output x + embedding.weight[:seq]."""
    weight = randn(gen, 8, 6)
    x = randn(gen, 3, 5, 6, dtype=torch.float64)
    emb = student.module("LearnedPositionalEmbedding", 8, 6)
    emb.load_state_dict({"embedding.weight": weight})
    got = emb(x)
    assert_close(got, x + weight[:5].double(), tol=tol, name="output", axes=X_AXES)


def test_seq_equal_to_max_len_is_allowed(student, tol, gen):
    """A sequence exactly max_len long is accepted by both encodings (no off-by-one ValueError)."""
    x = randn(gen, 2, 6, 8)
    got = student.module("SinusoidalPositionalEncoding", 8, max_len=6)(x)
    assert_close(got, x + sinusoidal64(6, 8).float(), tol=tol, name="sinusoidal output", axes=X_AXES)
    weight = randn(gen, 6, 8)
    emb = student.module("LearnedPositionalEmbedding", 6, 8)
    emb.load_state_dict({"embedding.weight": weight})
    got = emb(x)
    assert_close(got, x + weight, tol=tol, name="learned output", axes=X_AXES)


def test_learned_embedding_gradient_reaches_used_rows_only(student, tol, gen):
    """Backward reaches embedding rows 0..seq-1 (summed over the batch) and no others; x's gradient passes through."""
    weight = randn(gen, 10, 8)
    x, g_out = randn(gen, 3, 4, 8), randn(gen, 3, 4, 8)
    emb = student.module("LearnedPositionalEmbedding", 10, 8)
    emb.load_state_dict({"embedding.weight": weight})
    g = student.grad(emb, x, grad_outputs=(g_out,))
    expected = torch.zeros(10, 8)
    expected[:4] = g_out.sum(0)
    assert_true(set(g.param_grads) == {"embedding.weight"},
                f"expected a gradient for embedding.weight only, got {sorted(g.param_grads)}")
    assert_close(g.param_grads["embedding.weight"], expected, tol=tol, name="gradient w.r.t. embedding.weight",
                 axes=("position", "d_model"))
    assert_close(g.input_grads[0], g_out, tol=tol, name="gradient w.r.t. x", axes=X_AXES)


def _check_dropout(module, x, expected, p, tol, *, added):
    """Eval mode gives ``expected`` (x + ``added``); training mode zeroes a fraction ~p of it
    (+- 0.03 over 8,192 outputs) and scales the rest by 1 / (1 - p)."""
    got_eval = module(x)
    module.train()
    got_train = module(x)
    assert_close(got_eval, expected, tol=tol, name="output in eval mode", axes=X_AXES)
    assert_true(isinstance(got_train, torch.Tensor) and got_train.shape == x.shape,
                "the training output must be a (batch, seq, d_model) tensor")
    dropped = got_train == 0
    frac = dropped.double().mean().item()
    assert_true(abs(frac - p) <= 0.03, f"dropout={p} in training zeroed a fraction {frac:.3f} (expected {p} +- 0.03)",
                hidden="training mode did not zero a fraction of about `dropout` of the outputs")
    assert_close(got_train[~dropped], expected[~dropped] / (1 - p), tol=tol,
                 name=f"surviving training outputs ((x + {added}) / (1 - p))")


def test_sinusoidal_dropout_only_in_training(student, tol, gen):
    """dropout=0.5 zeroes ~half of x + pe and doubles the rest in training mode, and does nothing in eval mode."""
    p = 0.5
    x = randn(gen, 8, 64, 16)
    expected = x + sinusoidal64(64, 16).float()
    pos = student.module("SinusoidalPositionalEncoding", 16, max_len=64, dropout=p)
    _check_dropout(pos, x, expected, p, tol, added="pe")


def test_learned_embedding_dropout_only_in_training(student, tol, gen):
    """dropout=0.25 zeroes ~25% of x + embedding and rescales the rest in training mode only."""
    p = 0.25
    weight = randn(gen, 64, 16)
    x = randn(gen, 8, 64, 16)
    expected = x + weight
    emb = student.module("LearnedPositionalEmbedding", 64, 16, dropout=p)
    emb.load_state_dict({"embedding.weight": weight})
    _check_dropout(emb, x, expected, p, tol, added="embedding")
