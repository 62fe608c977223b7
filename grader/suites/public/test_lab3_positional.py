"""Lab 3 public tests: sinusoidal positional encoding and the learned positional embedding.

Run them with `grader check <your folder>`.  PyTorch has no built-in positional encoding, so
the expected values come from the closed-form formula (computed in float64).  The grader runs more (hidden) tests: odd d_model, another
base, long tables, float64 inputs, gradients, dropout and the seq == max_len edge.
"""

import torch.nn.functional as F  # noqa: F401
import pytest  # noqa: F401

from grader.engine.compare import assert_close
from grader.suites._inputs import randn, sinusoidal64

X_AXES = ("batch", "seq", "d_model")
PE_AXES = ("position", "feature")


def test_sinusoidal_matches_formula(student, tol):
    """sinusoidal_positional_encoding(12, 16) is float32 sin/cos of pos / 10000**(2i/d_model)."""
    got = student.call("sinusoidal_positional_encoding", 12, 16)
    assert_close(got, sinusoidal64(12, 16).float(), tol=tol, name="sinusoidal_positional_encoding(12, 16)",
                 axes=PE_AXES)


def test_sinusoidal_module_adds_encoding(student, tol, gen):
    """SinusoidalPositionalEncoding(16, max_len=32) returns x + pe[:seq] for a shorter sequence."""
    x = randn(gen, 2, 10, 16)
    got = student.module("SinusoidalPositionalEncoding", 16, max_len=32)(x)
    expected = x + sinusoidal64(32, 16).float()[:10]
    assert_close(got, expected, tol=tol, name="output", axes=X_AXES)


def test_sinusoidal_module_rejects_seq_longer_than_max_len(student, gen):
    """SinusoidalPositionalEncoding raises ValueError when seq > max_len."""
    x = randn(gen, 1, 7, 8)
    with student.raises("ValueError"):
        student.module("SinusoidalPositionalEncoding", 8, max_len=6)(x)


def test_pe_buffer_has_max_len_rows(student, tol):
    """The buffer "pe" holds the whole (max_len, d_model) table from the formula."""
    pe = student.module("SinusoidalPositionalEncoding", 6, max_len=50).buffer("pe")
    assert_close(pe, sinusoidal64(50, 6).float(), tol=tol, name='buffer "pe"', axes=PE_AXES)


def test_learned_embedding_adds_loaded_weights(student, tol, gen):
    """LearnedPositionalEmbedding(10, 8) returns x + embedding.weight[:seq] with the loaded weights."""
    weight = randn(gen, 10, 8)
    x = randn(gen, 2, 6, 8)
    emb = student.module("LearnedPositionalEmbedding", 10, 8)
    emb.load_state_dict({"embedding.weight": weight})
    got = emb(x)
    assert_close(got, x + weight[:6], tol=tol, name="output", axes=X_AXES)


def test_learned_embedding_rejects_seq_longer_than_max_len(student, gen):
    """LearnedPositionalEmbedding raises ValueError when seq > max_len."""
    x = randn(gen, 2, 5, 8)
    with student.raises("ValueError"):
        student.module("LearnedPositionalEmbedding", 4, 8)(x)
