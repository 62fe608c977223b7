"""Lab 8 public tests: the encoder-decoder's attention, encode, decode, forward and greedy
decoding against a reference holding the same (random) weights, and one run of your train().

Run them with `grader check <your folder>`.  The expected values come from a float64 model
loaded with the contract's parameter names (src_emb, tgt_emb, encoder.N.{self_attn.{q,k,v,
out}_proj, ff.0, ff.2, norm1, norm2}, decoder.N.{self_attn.*, cross_attn.*, ff.0, ff.2,
norm1, norm2, norm3}, norm_enc, norm_dec, out), strictly.  train(seed, budget_s) runs once
per grading, with the rubric's CPU budget, and its returned weights are scored by the
grader: this test checks the budget and the evidence of training with your own model;
hidden tests check it again with the reference model, and score the reversals on sequences
the grader draws itself.
"""

import torch
import pytest  # noqa: F401

from grader.engine.compare import assert_close, assert_true
from grader.suites._inputs import (
    LAB8_CFG as CFG,
    digit_sources,
    lab8_attention_reference,
    lab8_attention_weights,
    seq2seq_decode_reference,
    seq2seq_encode_reference,
    seq2seq_forward_reference,
    same_decoding,
    seq2seq_greedy_reference,
    seq2seq_weights,
    target_prefixes,
)
from grader.suites._training import (
    MODEL_CLASS,
    can_judge_through_start,
    heldout,
    own_loss,
    own_exact_fraction,
    pad_loss_problems,
    train_once,
    training_figures,
    training_problems,
)

X_AXES = ("batch", "seq", "d_model")
LOGIT_AXES = ("batch", "seq", "vocab")


def _model(student, sd, cfg=CFG):
    model = student.module(MODEL_CLASS, *cfg)
    model.load_state_dict(sd)
    return model


def test_attention_matches_reference(student, tol, gen):
    """Attention(16, 4): queries from one sequence, keys/values from another (7 vs 5
    positions), a bool mask (B, 1, 1, Tk) blocking some keys."""
    sd = lab8_attention_weights(gen, 16)
    query, key_value = torch.randn(2, 7, 16, generator=gen), torch.randn(2, 5, 16, generator=gen)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])[:, None, None, :]
    attn = student.module("Attention", 16, 4)
    attn.load_state_dict(sd)
    got = attn(query, key_value, mask)
    assert_close(got, lab8_attention_reference(sd, 16, 4, query, key_value, mask), tol=tol,
                 name="Attention output", axes=X_AXES)


def test_encode_matches_reference(student, tol, gen):
    """encode(src): embeddings scaled by sqrt(d_model) plus pe, the encoder layers with PAD
    keys masked, then norm_enc; sources of 6, 3 and 1 digits (PAD after)."""
    sd = seq2seq_weights(gen)
    src = digit_sources(gen, [6, 3, 1])
    got = _model(student, sd).method("encode", src)
    assert_close(got, seq2seq_encode_reference(sd, src), tol=tol, name="memory", axes=X_AXES)


def test_decode_matches_reference(student, tol, gen):
    """decode(tgt_in, memory, src): causal self-attention, cross-attention to a given memory
    (PAD source keys masked), feed-forward, norm_dec, out; 5 target positions, 4 source."""
    sd = seq2seq_weights(gen)
    src = digit_sources(gen, [4, 2])
    memory = torch.randn(2, 4, CFG[1], generator=gen)
    tgt_in = target_prefixes(gen, 2, 5)
    got = _model(student, sd).method("decode", tgt_in, memory, src)
    assert_close(got, seq2seq_decode_reference(sd, tgt_in, memory, src), tol=tol, name="logits",
                 axes=LOGIT_AXES)


def test_forward_is_decode_of_encode(student, tol, gen):
    """forward(src, tgt_in) = decode(tgt_in, encode(src), src)."""
    sd = seq2seq_weights(gen)
    src = digit_sources(gen, [5, 5, 2])
    tgt_in = target_prefixes(gen, 3, 6)
    got = _model(student, sd)(src, tgt_in)
    assert_close(got, seq2seq_forward_reference(sd, src, tgt_in), tol=tol, name="logits",
                 axes=LOGIT_AXES)


def test_greedy_decode_matches_reference(student, gen):
    """greedy_decode(src, 6): BOS, then the argmax token step by step (same tokens as the
    reference with the same weights)."""
    sd = seq2seq_weights(gen)
    src = digit_sources(gen, [4, 3, 2])
    got = _model(student, sd).method("greedy_decode", src, 6)
    expected = seq2seq_greedy_reference(sd, src, 6)
    assert_true(isinstance(got, torch.Tensor) and got.dtype == torch.long,
                "greedy_decode must return a long tensor of token ids")
    assert_true(same_decoding(got, expected, 6),
                f"greedy_decode gave {got.tolist()}, expected {expected.tolist()} (BOS first, "
                "then the argmax of the last position's logits, one token per step; PAD after "
                "a row's EOS)")


def test_train_returns_a_trained_model_within_budget(student, budget, gen, training_start,
                                                     request):
    """train(seed, budget_s) returns, within its CPU budget, the Seq2SeqTransformer it
    trained from the start the grader gave it (initial weights drawn by the grader): replayed
    through your model, its loss is at most half the start's, its weights still hold that
    start, and its loss ignored PAD targets. (The hidden tests replay them through the
    contract's reference model.)"""
    trained = train_once(student, budget, training_start)
    src, tgt = heldout(gen, 256)
    # What the matrices compute is judged with the contract's reference model: a student
    # release has none, so there the grading's hidden tests judge it (and the student is told).
    through_start = can_judge_through_start()
    problems = training_problems(
        trained, src, tgt, loss_of=lambda sd, s, t: own_loss(student, sd, s, t),
        model_words="your model (your forward with your weights)", through_start=through_start)
    problems += pad_loss_problems(trained)
    figures = training_figures(
        trained, own_loss(student, trained["start"], src, tgt),
        own_loss(student, trained["state_dict"], src, tgt),
        own_exact_fraction(student, trained["state_dict"], src, tgt), len(src))
    if not through_start:
        figures += (" Not checked here (this release has no reference model): whether your "
                    "weights work through the grader's start; the grading checks it.")
    request.node.user_properties.append(("report", figures))
    assert_true(not problems, "; ".join(problems) + "\n" + figures)
