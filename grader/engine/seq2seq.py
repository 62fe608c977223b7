"""Lab 8's reference model on the grader's own sequences: draw held-out reversal
sequences, load a returned state dict into the reference ``Seq2SeqTransformer`` (strictly),
and measure what it predicts. Trusted code: only the weights came from a worker.

Shared by lab 8's suites (``grader.suites._training``) and its mistakes catalogue
(``grader.mistakes.lab8_train_transformer``), which sits below the suites.
"""

from __future__ import annotations

import torch

from grader.engine.memo import memoized
from grader.engine.reference import load_reference

LAB = "lab8_train_transformer"
PAD = 12
MODEL_CLASS = "Seq2SeqTransformer"
SCORED_LENGTHS = (1, 8)     # the lengths trained on, scored
HELD_OUT = 512              # sequences drawn per check


def reference():
    return load_reference(LAB)


def heldout(gen: torch.Generator, n: int = HELD_OUT, lengths=SCORED_LENGTHS):
    """(src, tgt) of ``n`` sequences drawn from ``gen``, as the contract's make_batch draws
    them (lengths, then digits): src right-padded with PAD, tgt = BOS, reversed, EOS, PAD."""
    lengths_ = torch.randint(lengths[0], lengths[1] + 1, (n,), generator=gen)
    seq = int(lengths_.max())
    digits = torch.randint(0, 10, (n, seq), generator=gen)
    src = digits.clone()
    tgt = torch.full((n, seq + 2), PAD, dtype=torch.long)
    tgt[:, 0] = 10                                         # BOS
    for b, length in enumerate(lengths_.tolist()):
        src[b, length:] = PAD
        tgt[b, 1:length + 1] = digits[b, :length].flip(0)
        tgt[b, length + 1] = 11                            # EOS
    return src, tgt


def load_model(state_dict: dict):
    """The reference Seq2SeqTransformer holding ``state_dict`` (strictly), in eval mode; a
    ValueError that names the missing and unexpected keys when it does not load."""
    model = getattr(reference(), MODEL_CLASS)()
    if not isinstance(state_dict, dict):
        raise ValueError("the trained model's state_dict is not a dict of tensors")
    try:
        model.load_state_dict(state_dict, strict=True)
    except RuntimeError as exc:
        first = str(exc).split("\n\t")[1:4]
        raise ValueError("the returned model's state_dict does not load into the contract's "
                         f"Seq2SeqTransformer(): {'; '.join(first)[:600]} (a renamed or "
                         "resized layer?)") from None
    return model.eval()


@memoized
def current_token_fraction(state_dict: dict, src: torch.Tensor, tgt: torch.Tensor) -> float:
    """How often the model's argmax at a position is the token it *reads* there (not the
    next one): near 1 for a model trained with teacher forcing off by one."""
    model = load_model(state_dict)
    with torch.no_grad():
        logits = model(src, tgt[:, :-1])
    tokens = tgt[:, :-1]
    real = tokens != PAD
    return float((logits.argmax(-1) == tokens)[real].double().mean())
