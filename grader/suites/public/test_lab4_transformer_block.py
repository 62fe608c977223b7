"""Lab 4 public tests: the feed-forward network and the Transformer encoder block.

Run them with `grader check <your folder>`.  The expected block outputs come from PyTorch's
own torch.nn.TransformerEncoderLayer(batch_first=True, dropout=0) holding the same (random)
weights as your block: self_attn <- attn, linear1/linear2 <- ff.linear1/ff.linear2, norm1,
norm2.  Its src_mask uses True = blocked, so the tests hand it ~mask.  The grader runs more
(hidden) tests: GELU blocks, other masks, dropout, default sizes and gradients.
"""

import torch.nn.functional as F  # noqa: F401
import pytest  # noqa: F401

from grader.engine.compare import assert_close
from grader.suites._inputs import (
    block_reference_output,
    block_weights,
    feedforward_reference,
    feedforward_weights,
    randn,
    tril_mask,
)

X_AXES = ("batch", "seq", "d_model")


def _block(student, sd, *args, **kwargs):
    block = student.module("TransformerBlock", *args, **kwargs)
    block.load_state_dict(sd)
    return block


def test_feedforward_relu_matches_reference(student, tol, gen):
    """FeedForward(8, 32) computes linear2(relu(linear1(x))) with the loaded weights."""
    sd = feedforward_weights(gen, 8, 32)
    x = randn(gen, 2, 5, 8)
    ff = student.module("FeedForward", 8, 32)
    ff.load_state_dict(sd)
    got = ff(x)
    assert_close(got, feedforward_reference(sd, x, "relu"), tol=tol, name="output", axes=X_AXES)


def test_feedforward_gelu_matches_reference(student, tol, gen):
    """FeedForward(8, 32, activation="gelu") uses the exact GELU (as PyTorch's Transformer layers do)."""
    sd = feedforward_weights(gen, 8, 32)
    x = randn(gen, 2, 5, 8)
    ff = student.module("FeedForward", 8, 32, activation="gelu")
    ff.load_state_dict(sd)
    got = ff(x)
    assert_close(got, feedforward_reference(sd, x, "gelu"), tol=tol, name="output", axes=X_AXES)


def test_post_norm_block_matches_pytorch(student, tol, gen):
    """A post-norm block (norm_first=False) matches nn.TransformerEncoderLayer with the same weights."""
    d_model, heads, d_ff = 16, 4, 32
    sd = block_weights(gen, d_model, d_ff)
    x = randn(gen, 2, 6, d_model)
    got = _block(student, sd, d_model, heads, d_ff)(x)
    expected = block_reference_output(sd, d_model, heads, d_ff, x, norm_first=False)
    assert_close(got, expected, tol=tol, name="output", axes=X_AXES)


def test_pre_norm_block_matches_pytorch(student, tol, gen):
    """A pre-norm block (norm_first=True) matches nn.TransformerEncoderLayer(norm_first=True)."""
    d_model, heads, d_ff = 16, 4, 32
    sd = block_weights(gen, d_model, d_ff)
    x = randn(gen, 2, 6, d_model)
    got = _block(student, sd, d_model, heads, d_ff, norm_first=True)(x)
    expected = block_reference_output(sd, d_model, heads, d_ff, x, norm_first=True)
    assert_close(got, expected, tol=tol, name="output", axes=X_AXES)


def test_block_causal_mask_matches_pytorch(student, tol, gen):
    """With a causal mask (True = may attend) the block matches PyTorch given the inverted mask."""
    d_model, heads, d_ff = 16, 2, 32
    sd = block_weights(gen, d_model, d_ff)
    x = randn(gen, 2, 6, d_model)
    mask = tril_mask(6)
    got = _block(student, sd, d_model, heads, d_ff)(x, mask=mask)
    expected = block_reference_output(sd, d_model, heads, d_ff, x, mask)
    assert_close(got, expected, tol=tol, name="output", axes=X_AXES)
