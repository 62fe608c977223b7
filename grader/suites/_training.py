"""Lab 8's outcome grading, on the trusted side: what a trained model achieves, and whether
it was trained.

``train(seed, budget_s)`` runs once per submission in a sandbox worker (``student.train``);
only weights come back (protocol "train": the state dict it returned, the one from just
before it first learnt, its optional loss history). Everything here runs the *reference*
``Seq2SeqTransformer`` (solutions/lab8_train_transformer.py) on those weights, loaded
strictly, on sequences the grader draws itself. Nothing the student's code computed is
trusted beyond the weights.

Evidence of training (docs/security.md, "Lab 8"): weights set by hand can reverse digits
exactly, so the outcome points also need

1. a snapshot before learning: the worker saw the model's first forward with gradients on
   (or first optimizer step) and kept its weights then;
2. that snapshot near chance: its teacher-forced loss on held-out sequences at least
   ``INITIAL_LOSS_MIN`` nats per token (chance, uniform over 13 tokens, is ln 13 ~ 2.56);
3. the returned weights far better: their loss at most ``LOSS_DROP`` times the initial one;
4. the returned weights reached from the snapshot by small steps: the median, over the
   2-D weight matrices, of the correlation between a matrix before and after training is
   at least ``CORRELATION_MIN`` (independent matrices give ~0, the reference's ~0.9).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from grader.engine.compare import Mismatch, assert_true
from grader.engine.memo import memoized
from grader.engine.student import StudentError
# The reference model on the grader's sequences, shared with lab 8's mistakes (which may
# not import the suites); the suites import these names from here.
from grader.engine.seq2seq import (  # noqa: F401 - re-exported for the suites
    HELD_OUT, LAB, MODEL_CLASS, PAD, SCORED_LENGTHS, current_token_fraction, heldout,
    load_model, reference)
from grader.suites._inputs import LAB8_CFG, digit_sources, seq2seq_weights, target_prefixes

TRAIN_SEED = 8              # the seed every outcome test passes: one training per submission
LONGER_LENGTHS = (9, 31)    # up to max_len - 1: reported, not scored
CHANCE_LOSS = math.log(13)
INITIAL_LOSS_MIN = 1.5      # nats per token; the reference's snapshots: 2.6-2.8 (bench)
LOSS_DROP = 0.5             # the trained loss must be at most half the initial one
CORRELATION_MIN = 0.2       # median per-matrix correlation; the reference's: ~0.9 (bench)


@memoized  # the tiers share one evaluation of a submission's weights
def exact_fraction(state_dict: dict, src: torch.Tensor, tgt: torch.Tensor) -> float:
    """The fraction of rows that greedy decoding (reference code, the weights given)
    reverses exactly: BOS, the reversed digits, EOS, nothing else."""
    model = load_model(state_dict)
    with torch.no_grad():
        out = model.greedy_decode(src, src.size(1) + 1)      # (B, <= S + 2)
    padded = torch.full_like(tgt, PAD)
    width = min(out.size(1), tgt.size(1))
    padded[:, :width] = out[:, :width]
    return float((padded == tgt).all(dim=1).double().mean())


@memoized  # the same weights are checked by every outcome test
def teacher_forced_loss(state_dict: dict, src: torch.Tensor, tgt: torch.Tensor) -> float:
    """Cross-entropy (nats per target token, PAD ignored) of the next token, reference
    forward with these weights: tgt[:, :-1] in, tgt[:, 1:] predicted."""
    model = load_model(state_dict)
    with torch.no_grad():
        logits = model(src, tgt[:, :-1])
    return float(F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt[:, 1:].reshape(-1),
                                 ignore_index=PAD))


def weight_correlations(initial: dict, final: dict) -> dict[str, float]:
    """Pearson correlation of each 2-D weight matrix before and after training."""
    out = {}
    for name, after in final.items():
        before = initial.get(name)
        if not (isinstance(after, torch.Tensor) and isinstance(before, torch.Tensor)
                and after.dim() == 2 and before.shape == after.shape):
            continue
        pair = torch.stack([before.flatten().double(), after.flatten().double()])
        value = torch.corrcoef(pair)[0, 1]
        out[name] = float(value) if bool(torch.isfinite(value)) else 0.0
    return out


def training_problems(reply: dict, src: torch.Tensor, tgt: torch.Tensor,
                      loss_of=None, model_words: str = "the contract's model (the grader's "
                      "reference forward with your weights)") -> list[str]:
    """Why the weights do not show training (empty: they do); each reason teaches.
    ``loss_of(state_dict, src, tgt)``: the teacher-forced loss (default: the reference's,
    ``teacher_forced_loss``); ``model_words`` names the model it runs."""
    loss_of = loss_of or teacher_forced_loss
    initial, final = reply.get("initial"), reply["state_dict"]
    if not isinstance(initial, dict):
        return ["no training step was seen: the model returned never ran a forward pass "
                "with gradients on, nor an optimizer step (train it with teacher forcing: "
                "a forward, loss.backward(), optimizer.step())"]
    try:
        before = loss_of(initial, src, tgt)
    except (ValueError, StudentError):
        return ["the model's weights before its first training step do not load into the "
                "contract's Seq2SeqTransformer (was the model rebuilt or resized after it "
                "started training?)"]
    after = loss_of(final, src, tgt)
    problems = []
    # Fail closed: every comparison with NaN is False, so each check asks for the good case.
    broken = [name for state in (initial, final) for name, t in state.items()
              if isinstance(t, torch.Tensor) and t.is_floating_point()
              and not bool(torch.isfinite(t).all())]
    if broken or not (math.isfinite(before) and math.isfinite(after)):
        return [f"the weights hold NaN or infinite values ({', '.join(sorted(set(broken))[:3]) or 'the loss'}"
                "): a training step that diverged, or weights set by hand, show no training"]
    if not before >= INITIAL_LOSS_MIN:
        problems.append(
            f"the model already predicted the task before its first training step (loss "
            f"{before:.2f} nats per token; a fresh model is near chance, ln 13 = "
            f"{CHANCE_LOSS:.2f}): outcome points need weights learnt by training, not set "
            "or loaded before it")
    if not after <= LOSS_DROP * before:
        problems.append(
            f"training did not lower the loss enough under {model_words}: {before:.2f} nats per token "
            f"before the first step, {after:.2f} after (at most {LOSS_DROP:g}x the initial "
            "loss is needed); if the module tests fail too, your forward differs from the "
            "contract and the weights learnt to work with yours only")
    correlations = weight_correlations(initial, final)
    if correlations:
        median = sorted(correlations.values())[len(correlations) // 2]
        if not median >= CORRELATION_MIN:
            problems.append(
                f"the returned weights are not reachable from the initial ones by training "
                f"steps (median correlation per weight matrix {median:.2f}, at least "
                f"{CORRELATION_MIN:g} expected): were they replaced after training started?")
    return problems


def probe_forward(student) -> None:
    """One forward of the student's model on fixed weights and inputs, made by every outcome
    test after train(): not checked here (the module tests do that); recorded for the
    diagnosis of a failed outcome (grader.mistakes.lab8_train_transformer), since a wrong
    forward trains a wrong model. Its errors are the module tests' business."""
    gen = torch.Generator().manual_seed(0)
    sd = seq2seq_weights(gen)
    src, tgt_in = digit_sources(gen, [5, 3]), target_prefixes(gen, 2, 6)
    model = student.module(MODEL_CLASS, *LAB8_CFG)
    model.load_state_dict(sd)
    try:
        model(src, tgt_in)
    except StudentError as exc:
        if exc.kind not in ("exception", "not_implemented"):
            raise


def train_once(student, budget) -> dict:
    """The reply of the submission's one train(TRAIN_SEED, budget_s) run (shared by every
    outcome test), checked for its CPU time and its weights' loading; a Mismatch that
    says why not."""
    limit = budget.cpu_s
    try:
        run = student.train("train", MODEL_CLASS, TRAIN_SEED, budget_s=limit)
    except StudentError as exc:
        advice = (f"check the clock with time.process_time() in your loop and stop with a "
                  f"margin before {limit:g} CPU seconds, model construction included")
        if exc.kind == "timeout":
            message = (f"train did not return within {limit:g} CPU seconds (the grader stopped "
                       f"it at the test's time limit): {advice}")
            raise Mismatch(message, message) from None
        if exc.kind == "crash":      # the worker's CPU-time limit kills it, among other causes
            raise Mismatch(f"train did not return: {exc.describe(hidden=False)}; if it ran "
                           f"past its budget: {advice}",
                           f"train did not return: {exc.describe(hidden=True)}; if it ran "
                           f"past its budget: {advice}") from None
        probe_forward(student)
        raise
    probe_forward(student)
    # CPU time is read from the worker's own threads: work handed to another process (a
    # fork, a DataLoader with workers, a subprocess) would escape the budget, so it is
    # refused, as the resource tests refuse it (student.measure).
    assert_true(not run.other_processes,
                "train started another process (os.fork, multiprocessing, a DataLoader with "
                "num_workers > 0, a subprocess): the budget is CPU time in one process, so "
                "train in the worker itself (DataLoader(num_workers=0), no fork)")
    # 10% + 1 s: the grader's reading also counts the reply's encoding and the process's
    # own bookkeeping around the call.
    assert_true(run.cpu_s <= 1.1 * limit + 1.0,
                f"train took {run.cpu_s:.1f} CPU seconds, more than its budget of {limit:g} "
                "CPU seconds: check the clock with time.process_time() in your loop and stop "
                "with a margin",
                hidden=f"train took more than its budget of {limit:g} CPU seconds: check the "
                       "clock with time.process_time() in your loop")
    value = run.value
    assert_true(isinstance(value, dict) and isinstance(value.get("state_dict"), dict),
                "train must return the Seq2SeqTransformer it trained")
    return value


def assert_loads(state_dict: dict) -> None:
    """The trained weights load strictly into the reference Seq2SeqTransformer(); a
    Mismatch naming the keys that differ (the hidden message without them)."""
    try:
        load_model(state_dict)
    except ValueError as exc:
        raise Mismatch(str(exc), "the returned model's state_dict does not load into the "
                                 "contract's Seq2SeqTransformer()") from None


def own_loss(student, state_dict: dict, src: torch.Tensor, tgt: torch.Tensor) -> float:
    """The teacher-forced loss of ``state_dict`` under the student's own forward (in the
    worker): what the public test replays, as a student release has no reference model."""
    model = student.module(MODEL_CLASS)
    model.load_state_dict(state_dict)
    logits = model(src, tgt[:, :-1])
    if not (isinstance(logits, torch.Tensor) and logits.dim() == 3
            and logits.shape[:2] == tgt[:, :-1].shape):
        raise Mismatch("forward(src, tgt_in) must return logits (B, T, vocab_size)")
    return float(F.cross_entropy(logits.double().reshape(-1, logits.size(-1)),
                                 tgt[:, 1:].reshape(-1), ignore_index=PAD))

