"""Lab 8 mistakes: the encoder-decoder's masks and cross-attention, and teacher forcing.

The wrong models subclass the reference ``Seq2SeqTransformer`` (same parameters, so the
recorded state dict loads with strict=True) and override ``encode`` / ``decode`` with the
reference's steps, one of them wrong; a wrong decoder layer reaches the model through its
layers' class (as in lab 5). They are recognised on the module calls a test recorded: the
module tests', and the probe forward every outcome test makes after train() (its only use
is this diagnosis). A train request is never replayed (it trains); teacher forcing off by
one is read from the weights train() returned instead (``Rule``).
"""

from __future__ import annotations

import dataclasses

import torch

from grader.mistakes import Context, Impl, Replay, Rule
from grader.mistakes.lab5_decoder import ShapeCrashReplay
from grader.sandbox import protocol

LAB = "lab8_train_transformer"


def _module_calls(ctx: Context) -> Context:
    """``ctx`` without its train calls (they cannot be replayed)."""
    calls = [c for c in ctx.calls if c.req.get("op") != protocol.TRAIN]
    return dataclasses.replace(ctx, calls=calls, _memo={})


@dataclasses.dataclass
class ModuleReplay(Replay):
    """A Replay over the test's module calls only."""

    def matches(self, ctx: Context) -> bool:
        return super().matches(_module_calls(ctx))


@dataclasses.dataclass
class ModuleShapeCrashReplay(ShapeCrashReplay):
    """A ShapeCrashReplay over the test's module calls only."""

    def matches(self, ctx: Context) -> bool:
        return super().matches(_module_calls(ctx))


def decoder_layer_class(base, *, cross_from="memory", cross_mask=True):
    """DecoderLayer whose cross-attention takes keys/values from the decoder's own stream
    (``cross_from="decoder"``) and/or ignores the source mask (``cross_mask=False``)."""

    class WrongDecoderLayer(base):
        def forward(self, x, memory, causal_mask, src_mask):
            h = self.norm1(x)
            x = x + self.dropout(self.self_attn(h, h, causal_mask))
            h2 = self.norm2(x)
            kv = memory if cross_from == "memory" else h2
            x = x + self.dropout(self.cross_attn(h2, kv, src_mask if cross_mask else None))
            return x + self.dropout(self.ff(self.norm3(x)))

    return WrongDecoderLayer


def model_class(base, *, layer=None, causal=True, encoder_mask=True):
    """Seq2SeqTransformer whose decoder self-attention is not causal (``causal=False``),
    whose encoder ignores PAD keys (``encoder_mask=False``), or whose decoder layers are
    ``layer``."""

    class WrongSeq2Seq(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if layer is not None:
                for module in self.decoder:
                    module.__class__ = layer        # same parameters, other forward

        def encode(self, src):
            pad = Impl(LAB).reference.PAD
            src_mask = (src != pad)[:, None, None, :] if encoder_mask else None
            x = self.embed(src, self.src_emb)
            for module in self.encoder:
                x = module(x, src_mask)
            return self.norm_enc(x)

        def decode(self, tgt_in, memory, src):
            pad = Impl(LAB).reference.PAD
            t = tgt_in.size(1)
            mask = torch.ones(t, t, dtype=torch.bool, device=tgt_in.device)
            if causal:
                mask = mask.tril()
            src_mask = (src != pad)[:, None, None, :]
            x = self.embed(tgt_in, self.tgt_emb)
            for module in self.decoder:
                x = module(x, memory, mask, src_mask)
            return self.out(self.norm_dec(x))

    return WrongSeq2Seq


def teacher_forcing_off_by_one(ctx: Context) -> bool:
    """train() returned weights that predict the token a position *reads* rather than the
    next one (the reference's forward on the grader's own sequences)."""
    from grader.engine.seq2seq import current_token_fraction, heldout, load_model
    gen = torch.Generator().manual_seed(8)
    src, tgt = heldout(gen, 128)
    for call in ctx.calls:
        value = call.value
        if call.req.get("op") != protocol.TRAIN or not isinstance(value, dict):
            continue
        try:
            load_model(value.get("state_dict"))
        except ValueError:
            return False
        return current_token_fraction(value["state_dict"], src, tgt) > 0.9
    return False


def mistakes():
    ref = Impl(LAB).reference
    model, layer = ref.Seq2SeqTransformer, ref.DecoderLayer

    def wrong_layer(**kw):
        wrong = decoder_layer_class(layer, **kw)
        return Impl(LAB, {"DecoderLayer": wrong, "Seq2SeqTransformer": model_class(model, layer=wrong)})

    def wrong_model(**kw):
        return Impl(LAB, {"Seq2SeqTransformer": model_class(model, **kw)})

    return [
        ModuleShapeCrashReplay(
            id="cross_attention_keys_from_decoder",
            name="cross-attention keys and values from the decoder",
            hint="in DecoderLayer the cross-attention's queries come from the decoder "
                 "(norm2(x)) but its keys and values come from the encoder's output: "
                 "cross_attn(norm2(x), memory, src_mask); attending over the decoder's own "
                 "positions never reads the source (and the source mask no longer fits)",
            variants=[wrong_layer(cross_from="decoder"),
                      wrong_layer(cross_from="decoder", cross_mask=False)]),
        ModuleReplay(
            id="decoder_not_causal", name="decoder self-attention not causal",
            hint="the decoder's self-attention needs the causal mask (a (T, T) lower "
                 "triangle, diagonal included): with teacher forcing the whole target is "
                 "fed at once, so without it position t sees token t + 1, the very answer it "
                 "must predict; the model learns to copy it and cannot generate",
            variants=[wrong_model(causal=False)]),
        ModuleReplay(
            id="pad_keys_not_masked", name="PAD source keys not masked",
            hint="source positions holding PAD are not tokens: mask them as keys with "
                 "(src != PAD)[:, None, None, :] in the encoder's self-attention and in "
                 "the decoder's cross-attention, so a padded sequence encodes and decodes "
                 "as it would unpadded",
            variants=[wrong_model(encoder_mask=False), wrong_layer(cross_mask=False),
                      Impl(LAB, {"Seq2SeqTransformer": model_class(
                          model, encoder_mask=False,
                          layer=decoder_layer_class(layer, cross_mask=False))})]),
        Rule(id="teacher_forcing_off_by_one", name="teacher forcing off by one",
             hint="the decoder reads tgt[:, :-1] (BOS and the answer so far) and must "
                  "predict tgt[:, 1:], the next token at every position; the model you "
                  "trained predicts the token it reads (targets not shifted), which the "
                  "causal mask lets it copy, so greedy decoding repeats BOS",
             predicate=teacher_forcing_off_by_one),
    ]
