"""Lab 5 public tests: the decoder layer, the parallel forward, the KV cache and greedy
generation.

Run them with `grader check <your folder>`.  The expected values come from a float64 model
holding the same (random) weights as yours, loaded by the contract's parameter names
(tok_emb, pos_emb, layers.N.{norm1, q_proj, k_proj, v_proj, out_proj, norm2, ff.0, ff.2},
norm, head).  The grader runs more (hidden) tests: prompts fed in other chunk splits, a
step over a given cache, the cache's growth per layer, max_len errors, dropout, float64
and gradients.
"""

import torch
import pytest  # noqa: F401

from grader.engine.compare import assert_close, assert_true
from grader.suites._inputs import (
    decoder_cache_reference,
    decoder_layer_reference,
    decoder_layer_weights,
    decoder_lm_weights,
    decoder_logits_reference,
    greedy_divergence,
    greedy_reference,
    randn,
    random_tokens,
)

X_AXES = ("batch", "seq", "d_model")
KV_AXES = ("batch", "heads", "seq", "d_head")
LOGIT_AXES = ("batch", "seq", "vocab")
CFG = (29, 16, 4, 32, 2, 24)          # vocab, d_model, heads, d_ff, layers, max_len


def _lm(student, sd, cfg=CFG):
    lm = student.module("DecoderLM", *cfg)
    lm.load_state_dict(sd)
    return lm


def test_layer_matches_reference(student, tol, gen):
    """DecoderLayer(16, 4, 32) without a cache: pre-norm causal self-attention, then the
    feed-forward; returns (y, (k, v)) with k, v of shape (B, heads, T, d_head)."""
    sd = decoder_layer_weights(gen, 16, 32)
    x = randn(gen, 2, 6, 16)
    layer = student.module("DecoderLayer", 16, 4, 32)
    layer.load_state_dict(sd)
    y, (k, v) = layer(x)
    y_exp, (k_exp, v_exp) = decoder_layer_reference(sd, 16, 4, 32, x)
    assert_close(y, y_exp, tol=tol, name="y", axes=X_AXES)
    assert_close(k, k_exp, tol=tol, name="k_all (the keys of the 6 positions)", axes=KV_AXES)
    assert_close(v, v_exp, tol=tol, name="v_all (the values of the 6 positions)", axes=KV_AXES)


def test_forward_matches_reference(student, tol, gen):
    """DecoderLM.forward(tokens) computes every position's logits in one causal pass."""
    sd = decoder_lm_weights(gen, CFG)
    tokens = random_tokens(gen, CFG[0], 2, 9)
    got = _lm(student, sd)(tokens)
    assert_close(got, decoder_logits_reference(sd, CFG, tokens), tol=tol, name="logits",
                 axes=LOGIT_AXES)


def test_cached_steps_match_parallel_forward(student, tol, gen):
    """Feeding the tokens one at a time through forward_step, each step with the cache the
    step before returned, gives the parallel forward's logits at every position."""
    sd = decoder_lm_weights(gen, CFG)
    tokens = random_tokens(gen, CFG[0], 2, 8)
    expected = decoder_logits_reference(sd, CFG, tokens)
    lm, cache = _lm(student, sd), None
    for t in range(tokens.size(1)):
        logits, cache = lm.method("forward_step", tokens[:, t:t + 1], cache)
        assert_close(logits, expected[:, t:t + 1], tol=tol,
                     name=f"logits of step {t} (the token at position {t}, after {t} cached)",
                     axes=LOGIT_AXES)


def test_layer_past_kv_layout(student, tol, gen):
    """DecoderLayer(x, past_kv) returns k_all, v_all of shape (B, heads, T_past + T_new,
    d_head): the past keys/values exactly as given, then the new ones."""
    sd = decoder_layer_weights(gen, 16, 32)
    past = (randn(gen, 2, 4, 5, 4), randn(gen, 2, 4, 5, 4))
    x = randn(gen, 2, 3, 16)
    layer = student.module("DecoderLayer", 16, 4, 32)
    layer.load_state_dict(sd)
    _, (k_all, v_all) = layer(x, past)
    _, (k_exp, v_exp) = decoder_layer_reference(sd, 16, 4, 32, x, past)
    for name, got, exp, old in (("k_all", k_all, k_exp, past[0]), ("v_all", v_all, v_exp, past[1])):
        assert_true(isinstance(got, torch.Tensor) and tuple(got.shape) == (2, 4, 8, 4),
                    f"{name} should have shape (batch 2, heads 4, T_past + T_new = 5 + 3, "
                    f"d_head 4), got {tuple(got.shape) if isinstance(got, torch.Tensor) else got}: "
                    "the cache grows on the sequence axis (dim 2) by the new positions")
        assert_close(got[:, :, :5], old, tol=type(tol)(0.0, 0.0),
                     name=f"{name}[:, :, :T_past] (must be the given past, unchanged)", axes=KV_AXES)
        assert_close(got[:, :, 5:], exp[:, :, 5:], tol=tol,
                     name=f"{name}[:, :, T_past:] (the 3 new positions)", axes=KV_AXES)


def test_generate_matches_greedy_without_cache(student, tol, gen):
    """generate(prompt, 8) with the cache picks the tokens that the argmax of the parallel
    forward over the whole sequence so far picks (greedy decoding without a cache)."""
    sd = decoder_lm_weights(gen, CFG)
    prompt = random_tokens(gen, CFG[0], 3, 4)
    got = _lm(student, sd).method("generate", prompt, 8)
    ref_tokens, ref_logits = greedy_reference(sd, CFG, prompt, 8)
    assert_true(isinstance(got, torch.Tensor) and tuple(got.shape) == (3, 12)
                and got.dtype == torch.int64,
                "generate(prompt (3, 4), 8) should return a long tensor of shape (3, 12), got "
                + (f"{got.dtype} {tuple(got.shape)}" if isinstance(got, torch.Tensor) else repr(got)))
    assert_true(torch.equal(got[:, :4], prompt), "the first T0 tokens of generate's output must "
                "be the prompt itself")
    where = greedy_divergence(got, ref_tokens, ref_logits, 4, tol)
    assert_true(where is None, "" if where is None else (
        f"row {where[0]}, new token {where[1]}: generate chose {where[2]} but the argmax of the "
        f"parallel forward over the same prefix is {where[3]}; check that each step feeds only "
        "the newest token, at position = the cache's length, with the cache the step before "
        "returned"))


def test_cache_reference_prompt(student, tol, gen):
    """forward_step(prompt) with no cache returns one (k, v) per layer, each (B, heads, T0,
    d_head), equal to the keys/values of the prompt's positions."""
    sd = decoder_lm_weights(gen, CFG)
    prompt = random_tokens(gen, CFG[0], 2, 5)
    _, cache = _lm(student, sd).method("forward_step", prompt)
    expected = decoder_cache_reference(sd, CFG, prompt)
    assert_true(isinstance(cache, (list, tuple)) and len(cache) == CFG[4],
                f"the cache should hold one (k, v) per layer ({CFG[4]}), got "
                + (f"{len(cache)} entries" if isinstance(cache, (list, tuple)) else repr(type(cache))))
    for i, (entry, (k_exp, v_exp)) in enumerate(zip(cache, expected, strict=True)):
        assert_true(isinstance(entry, (list, tuple)) and len(entry) == 2,
                    f"cache[{i}] must be a (k, v) pair")
        assert_close(entry[0], k_exp, tol=tol, name=f"cache[{i}][0] (layer {i}'s keys)", axes=KV_AXES)
        assert_close(entry[1], v_exp, tol=tol, name=f"cache[{i}][1] (layer {i}'s values)", axes=KV_AXES)
