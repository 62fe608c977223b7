"""Lab 2 public tests: split_heads / merge_heads and MultiHeadAttention.

Run them with `grader check <your folder>`.  The expected values come from PyTorch's own
torch.nn.MultiheadAttention(batch_first=True, average_attn_weights=False) holding the same
weights as your module (its in_proj_weight is [q_proj; k_proj; v_proj]).  The grader runs
more (hidden) tests: cross-attention, other mask shapes, all-blocked rows, bias=False,
dropout, float64 and gradients.
"""

import torch
import torch.nn.functional as F  # noqa: F401
import pytest  # noqa: F401

from grader.engine.compare import assert_close, assert_true
from grader.suites._inputs import mha_reference_outputs, mha_weights, randn

O_AXES = ("batch", "seq_q", "d_model")
W_AXES = ("batch", "heads", "seq_q", "seq_k")


def test_split_heads_shape_and_head_layout(student, tol, gen):
    """split_heads gives (batch, heads, seq, d_head) and head h holds features h*d_head:(h+1)*d_head."""
    x = randn(gen, 2, 5, 12)
    got = student.call("split_heads", x, 3)
    expected = torch.stack([x[:, :, h * 4:(h + 1) * 4] for h in range(3)], dim=1)
    assert_close(got, expected, tol=tol, name="split_heads(x, 3)", axes=("batch", "heads", "seq", "d_head"))


def test_merge_heads_inverts_split_heads(student, tol, gen):
    """merge_heads puts the heads back side by side: merge_heads(split_heads(x)) == x."""
    x = randn(gen, 2, 5, 12)
    heads = x.view(2, 5, 4, 3).transpose(1, 2)   # split into 4 heads of 3 features
    got = student.call("merge_heads", heads)
    assert_close(got, x, tol=tol, name="merge_heads(heads)", axes=("batch", "seq", "d_model"))


def test_split_heads_indivisible_raises_value_error(student, gen):
    """split_heads raises ValueError when d_model is not divisible by num_heads."""
    x = randn(gen, 2, 3, 10)
    with student.raises("ValueError"):
        student.call("split_heads", x, 4)


def test_self_attention_matches_pytorch(student, tol, gen):
    """Self-attention output and per-head weights match nn.MultiheadAttention with the same weights."""
    d_model, heads = 16, 4
    sd = mha_weights(gen, d_model)
    x = randn(gen, 2, 6, d_model)
    mha = student.module("MultiHeadAttention", d_model, heads)
    mha.load_state_dict(sd)
    out, w = mha(x, x, x)
    exp_out, exp_w = mha_reference_outputs(sd, d_model, heads, x, x, x)
    assert_close(w, exp_w, tol=tol, name="weights", axes=W_AXES)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)


def test_key_padding_mask_matches_pytorch(student, tol, gen):
    """A (batch, 1, 1, seq_k) key-padding mask (True = real token) matches PyTorch's key padding."""
    d_model, heads = 16, 2
    sd = mha_weights(gen, d_model)
    x = randn(gen, 3, 6, d_model)
    mask = (torch.arange(6) < torch.tensor([6, 4, 2])[:, None]).view(3, 1, 1, 6)
    mha = student.module("MultiHeadAttention", d_model, heads)
    mha.load_state_dict(sd)
    out, w = mha(x, x, x, mask=mask)
    exp_out, exp_w = mha_reference_outputs(sd, d_model, heads, x, x, x, mask)
    assert_close(w, exp_w, tol=tol, name="weights", axes=W_AXES)
    assert_true(bool((w[2, :, :, 2:] == 0).all()), "padded keys (mask False) must get exactly 0 weight")
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)


def test_need_weights_false_returns_none(student, tol, gen):
    """need_weights=False returns (output, None), with the same output."""
    d_model, heads = 8, 2
    sd = mha_weights(gen, d_model)
    x = randn(gen, 2, 5, d_model)
    mha = student.module("MultiHeadAttention", d_model, heads)
    mha.load_state_dict(sd)
    result = mha(x, x, x, need_weights=False)
    assert_true(isinstance(result, (tuple, list)) and len(result) == 2, "forward must return a pair (output, weights)")
    out, w = result
    assert_true(w is None, f"with need_weights=False the weights must be None, got {type(w).__name__}")
    exp_out, _ = mha_reference_outputs(sd, d_model, heads, x, x, x)
    assert_close(out, exp_out, tol=tol, name="output", axes=O_AXES)
