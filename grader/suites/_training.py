"""Lab 8's outcome grading, on the trusted side: what a trained model achieves, and whether
it was trained from the start the grader gave it.

``train(seed, budget_s)`` runs once per submission in a sandbox worker (``student.train``).
The start of that training is the grader's: it draws initial weights here (``start_state``:
the reference ``Seq2SeqTransformer()``'s own default initialisation, seeded from the course
secret and the lab file, so unknown before grading), sends them with the request, and every
``Seq2SeqTransformer`` built in the worker during train() starts from them (the given
``__init__`` runs, then they are copied in: protocol ``GivenStart``). Only weights come back
(the returned state dict, the optional loss history). Everything here runs the *reference*
``Seq2SeqTransformer`` (solutions/lab8_train_transformer.py) on them, loaded strictly, on
sequences the grader draws itself. Nothing the student's process says about itself is
evidence.

Evidence of training (docs/security.md, "Lab 8"): weights set by hand, or trained elsewhere
and shipped in the file, can reverse digits exactly, so the outcome points also need the
returned weights to be

1. trained: their teacher-forced loss on held-out sequences at most ``LOSS_DROP`` times that
   of the grader's start (near chance, ln 13 ~ 2.56, by construction; a trained model:
   0.001-0.1, the reference 0.001);
2. working *through* the grader's start: of what the weight matrices compute on the
   grader's sequences, a large part must be what the start's matrices compute
   (``functional_correlations``). Training takes steps from the start and keeps much of it
   in use; weights learnt elsewhere do not use this start, even where they hold it. A
   correlation of the *parameters* alone was beaten (#27, helper attack): the start kept
   only in entries that multiply an exact zero (residual dims whose LayerNorm gain is 0,
   value dims and ReLU units with zero rows, embedding rows never read) gives any
   parameter correlation at no cost, while the model computes the same without it. So each
   matrix W (and the start's S) is judged by what it contributes on the grader's sequences:
   at every position, g . (W x), x the matrix's input there (centred over the positions:
   an input that never varies is a bias, and a bias can cancel what S adds) and g the
   gradient there of a random projection of the logits (zero wherever the output is not
   used). The correlation of those contributions of W and of S, pooled over all matrices
   (each weighed by what it contributes: a matrix fed almost nothing counts for almost
   nothing), must be at least ``FUNCTIONAL_MIN``, and its median over the matrices at least
   ``FUNCTIONAL_MEDIAN_MIN``. Measured at two starts (bench_lab8_training.py, tests): the
   reference 0.80 pooled / 0.84-0.87 median, a constant Adam rate of 1e-2 with or without
   weight decay 0.38-0.45 / 0.56-0.72; the dead-entry attacks 0.02-0.18 / 0.00-0.07, weights
   of another start mixed with this one 0.17-0.42 at a loss that fails 1.;
3. in every matrix: each 2-D matrix's *parameter* correlation with the grader's at least
   ``CORRELATION_FLOOR``, so that no matrix can simply be shipped (a cheap check that makes
   a forger build and maintain dead entries at least).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from grader.engine.compare import Mismatch, assert_true
from grader.engine.memo import memoized
from grader.engine.reference import has_reference
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
LOSS_DROP = 0.25            # the trained loss: at most a quarter of the start's (module doc)
# What the weight matrices compute, correlated with what the start's compute (module doc):
# pooled over the matrices, and the median per matrix. Honest 0.38-0.80 pooled and
# 0.56-0.87 median (large constant steps at the bottom); attacks at most 0.18 and 0.07.
FUNCTIONAL_MIN = 0.25
FUNCTIONAL_MEDIAN_MIN = 0.3
FUNCTIONAL_DRAWS = 4        # random projections of the logits (seeded: the same every time)
# Every matrix's parameters: a file that silenced half the sub-layers (LayerNorm gains and
# biases at 0, so their matrices could stay exactly at the grader's start) and shipped the
# other matrices from elsewhere (~0.0) passed a median alone (re-attack of #27,
# atk_lab8_silenced_layers_keep_start). The reference's lowest matrix is 0.82; a matrix
# learnt from any other start is ~0.0 (sd 1/sqrt(elements), 0.016 for 64 x 64). 0.15: an
# honest constant Adam rate of 1e-2 with weight decay leaves its lowest matrix at 0.20.
CORRELATION_FLOOR = 0.15
HIDDEN_TIERS = (0.5, 0.8, 0.95)     # exact-match fractions of the hidden outcome tests


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


@memoized  # the same weights are checked by every outcome test
def functional_correlations(initial: dict, final: dict, src: torch.Tensor,
                            tgt: torch.Tensor) -> tuple[float, dict[str, float]]:
    """(pooled, {matrix name: correlation}): how much of what each weight matrix of
    ``final`` computes on (src, tgt) (teacher forcing, the reference forward) is what the
    ``initial`` matrix computes (module doc, 2.). For a matrix W with input x and output
    gradient g at each position (g of a random projection of the logits, PAD targets left
    out; FUNCTIONAL_DRAWS projections), its contribution there is g . (W x), x centred over
    the positions; the same with the start's S in W's place. Embeddings count as matrices
    on one-hot inputs. Correlations are uncentred (both have mean ~0) and 0.0 where a
    matrix contributes nothing."""
    model = load_model(final)
    layers = {name: m for name, m in model.named_modules()
              if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))}
    inputs, outputs = {}, {}

    def keep(name):
        def hook(module, args, out):
            x = args[0]
            if isinstance(module, torch.nn.Embedding):
                x = F.one_hot(x, module.num_embeddings)
            x = x.detach().reshape(-1, x.size(-1)).double()       # (positions, in)
            inputs[name] = x - x.mean(dim=0)
            out.retain_grad()
            outputs[name] = out
        return hook

    hooks = [m.register_forward_hook(keep(name)) for name, m in layers.items()]
    sums = {name: [0.0, 0.0, 0.0] for name in layers}      # <tW, tS>, |tW|^2, |tS|^2
    gen = torch.Generator().manual_seed(0)
    try:
        for _ in range(FUNCTIONAL_DRAWS):
            model.zero_grad(set_to_none=True)
            with torch.enable_grad():
                logits = model(src, tgt[:, :-1])                   # (B, T, vocab)
                scored = (tgt[:, 1:] != PAD).unsqueeze(-1).to(logits.dtype)
                (logits * torch.randn(logits.shape, generator=gen) * scored).sum().backward()
            for name, module in layers.items():
                out = outputs[name]
                if out.grad is None:
                    continue
                g = out.grad.detach().reshape(-1, out.size(-1)).double()  # (positions, out)
                w = final[f"{name}.weight"].double()
                s = initial[f"{name}.weight"].double()
                if isinstance(module, torch.nn.Embedding):         # (vocab, d): in x out
                    w, s = w.T, s.T
                t_w = ((inputs[name] @ w.T) * g).sum(dim=1)        # (positions,)
                t_s = ((inputs[name] @ s.T) * g).sum(dim=1)
                acc = sums[name]
                acc[0] += float(t_w @ t_s)
                acc[1] += float(t_w @ t_w)
                acc[2] += float(t_s @ t_s)
    finally:
        for hook in hooks:
            hook.remove()

    def corr(dot, ww, ss):
        value = dot / math.sqrt(ww * ss) if ww > 0 and ss > 0 else 0.0
        return value if math.isfinite(value) else 0.0

    per_matrix = {f"{name}.weight": corr(*acc) for name, acc in sums.items()}
    pooled = corr(*(sum(acc[i] for acc in sums.values()) for i in range(3)))
    return pooled, per_matrix


D_MODEL, D_FF, LAYERS, VOCAB = 64, 128, 2, 13      # the contract's default sizes


def _start_layout() -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, kind, shape) of every tensor of the default Seq2SeqTransformer()'s state dict,
    in its order; kind: "embedding", "linear" (weight, bias: fan-in = shape[-1] of the
    weight) or "norm" (LayerNorm weight, bias)."""
    out = [("src_emb.weight", "embedding", (VOCAB, D_MODEL)),
           ("tgt_emb.weight", "embedding", (VOCAB, D_MODEL))]

    def linear(prefix, n_in, n_out):
        out.extend([(f"{prefix}.weight", "linear", (n_out, n_in)),
                    (f"{prefix}.bias", "linear", (n_out, n_in))])

    def norm(prefix):
        out.extend([(f"{prefix}.weight", "norm", (D_MODEL,)), (f"{prefix}.bias", "norm", (D_MODEL,))])

    for stack, attentions, norms in (("encoder", ("self_attn",), 2),
                                     ("decoder", ("self_attn", "cross_attn"), 3)):
        for layer in range(LAYERS):
            for attention in attentions:
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    linear(f"{stack}.{layer}.{attention}.{proj}", D_MODEL, D_MODEL)
            linear(f"{stack}.{layer}.ff.0", D_MODEL, D_FF)
            linear(f"{stack}.{layer}.ff.2", D_FF, D_MODEL)
            for i in range(1, norms + 1):
                norm(f"{stack}.{layer}.norm{i}")
    norm("norm_enc")
    norm("norm_dec")
    linear("out", D_MODEL, VOCAB)
    return out


@memoized  # one start per grading, asked for by every outcome test
def start_state(seed: int) -> dict:
    """The grader's initial weights for a training (float32 tensors by the contract's
    names), drawn like the given code's default initialisation from a generator seeded with
    ``seed`` (``training_start``: the course secret and the lab file): Linear weights and
    biases uniform in +-1/sqrt(fan_in) (PyTorch's default), embeddings normal with std
    d_model^-0.5 (the given __init__), LayerNorms 1 and 0. Drawn here, not by the
    reference model, so a student release (no reference) gives the same kind of start."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, kind, shape in _start_layout():
        if kind == "embedding":
            state[name] = torch.randn(shape, generator=gen) * D_MODEL ** -0.5
        elif kind == "norm":
            state[name] = (torch.ones if name.endswith("weight") else torch.zeros)(shape)
        else:
            bound = shape[-1] ** -0.5                  # 1 / sqrt(fan_in)
            size = shape if name.endswith("weight") else shape[:1]
            state[name] = (torch.rand(size, generator=gen) * 2 - 1) * bound
    return state


def training_problems(reply: dict, src: torch.Tensor, tgt: torch.Tensor,
                      loss_of=None, model_words: str = "the contract's model (the grader's "
                      "reference forward with your weights)",
                      through_start: bool = True) -> list[str]:
    """Why the returned weights ``reply["state_dict"]`` do not show training from the
    grader's start ``reply["start"]`` (empty: they do); each reason teaches.
    ``loss_of(state_dict, src, tgt)``: the teacher-forced loss (default: the reference's,
    ``teacher_forced_loss``); ``model_words`` names the model it runs. ``through_start``:
    whether to judge what the matrices compute (2. of the module doc), which runs the
    reference model: False where there is none (a student release's public test; the
    grading's hidden tests always judge it)."""
    loss_of = loss_of or teacher_forced_loss
    start, final = reply["start"], reply["state_dict"]
    before = loss_of(start, src, tgt)
    after = loss_of(final, src, tgt)
    # Fail closed: every comparison with NaN is False, so each check asks for the good case.
    broken = [name for name, t in final.items()
              if isinstance(t, torch.Tensor) and t.is_floating_point()
              and not bool(torch.isfinite(t).all())]
    if broken or not (math.isfinite(before) and math.isfinite(after)):
        return [f"the weights hold NaN or infinite values ({', '.join(sorted(set(broken))[:3]) or 'the loss'}"
                "): a training step that diverged, or weights set by hand, show no training"]
    problems = []
    if not after <= LOSS_DROP * before:
        problems.append(
            f"training did not lower the loss enough under {model_words}: {before:.2f} nats "
            f"per token at the grader's start, {after:.2f} for the returned weights (at most "
            f"{LOSS_DROP:g}x the start's is needed). {HOW_LOSS_IS_COMPUTED} If your own loss "
            "curve falls and this one does not, your loss compares other positions than "
            "these (teacher forcing off by one?); if the module tests fail too, your forward "
            "differs from the contract and the weights learnt to work with yours only")
    if through_start:
        problems += _through_start_problems(start, final, src, tgt)
    correlations = weight_correlations(start, final)
    lowest = min(correlations, key=correlations.get) if correlations else None
    if lowest is not None and not correlations[lowest] >= CORRELATION_FLOOR:
        problems.append(
            f"the returned {lowest} did not come from the start the grader gave train() "
            f"(its correlation with the grader's initial {lowest} is "
            f"{correlations[lowest]:.2f}; every weight matrix needs at least "
            f"{CORRELATION_FLOOR:g}, training keeps much of the start in each): train every "
            "part of the model as built, and do not load weights into any of it")
    return problems


def can_judge_through_start() -> bool:
    """Whether this process has the contract's reference model to judge what the returned
    matrices compute (2. of the module doc): the course's grading does, a student release
    does not."""
    return has_reference(LAB)


def _through_start_problems(start: dict, final: dict, src: torch.Tensor,
                            tgt: torch.Tensor) -> list[str]:
    """Why ``final`` does not work through the grader's ``start`` (2. of the module doc;
    empty: it does). NaN correlations fail: every comparison asks for the good case."""
    pooled, per_matrix = functional_correlations(start, final, src, tgt)
    median = sorted(per_matrix.values())[len(per_matrix) // 2] if per_matrix else 0.0
    if pooled >= FUNCTIONAL_MIN and median >= FUNCTIONAL_MEDIAN_MIN:
        return []
    return [
        f"the returned weights do not work through the start the grader gave train(): "
        f"of what their weight matrices compute on the grader's sequences, the part that "
        f"the grader's initial matrices compute correlates {pooled:.2f} (median per "
        f"matrix {median:.2f}; at least {FUNCTIONAL_MIN:g} and {FUNCTIONAL_MEDIAN_MIN:g} "
        f"expected: a model trained from the start keeps using much of it). Every "
        "Seq2SeqTransformer() built in train() starts from weights the grader draws; "
        "train that model as built, and do not re-initialise it, load other weights "
        "into it or leave parts of it unused"]


def pad_loss_problems(reply: dict) -> list[str]:
    """Why train()'s loss does not ignore PAD targets (empty: it does, or no training step
    read PAD): the worker saw the gradient of the first training step whose decoder read
    PAD tokens (protocol ``GivenStart``): where the decoder reads PAD the target is PAD
    too, so a cross-entropy with ignore_index=PAD gives those logits no gradient at all."""
    probe = reply.get("pad_probe")
    if not isinstance(probe, dict):
        return []
    pad, real = probe.get("pad_grad"), probe.get("real_grad")
    if not (isinstance(pad, float) and isinstance(real, float)):
        return []
    if pad <= 1e-6 * max(real, 1e-12) or not real > 0:
        return []
    return [f"your loss counts PAD targets: in your first training step, the logits at the "
            f"{probe.get('pad_positions')} positions where the decoder read PAD (their target "
            f"is PAD too) got a gradient of up to {pad:.2g} (the real positions: up to "
            f"{real:.2g}); the contract's loss ignores PAD: F.cross_entropy(logits.reshape(-1, "
            "13), tgt[:, 1:].reshape(-1), ignore_index=PAD)"]


def training_figures(trained: dict, before: float, after: float, exact: float,
                     sequences: int) -> str:
    """What the student is told of their training, passed or not: CPU seconds of the budget,
    the loss at the grader's start and of the returned weights, exact reversals of the
    public held-out sequences, and what the hidden tiers need."""
    tiers = " / ".join(f"{t:.0%}" for t in HIDDEN_TIERS)
    return (f"Your training: {trained['cpu_s']:.1f} of {trained['budget_s']:g} CPU seconds; "
            f"loss {before:.2f} nats per token at the grader's start, {after:.3f} for the "
            f"returned weights (teacher forcing: model(src, tgt[:, :-1]) predicting "
            f"tgt[:, 1:], PAD ignored); your greedy_decode reverses {exact:.1%} of "
            f"{sequences} public held-out sequences (lengths 1-8) exactly. The hidden tests "
            f"score the same on the grader's own sequences: {tiers} exact earn their points "
            f"(2 each).")


def training_paragraph(trained: dict, src: torch.Tensor, tgt: torch.Tensor,
                       exact: float) -> str:
    """What the grader saw the training do, from its own evidence (#42): the CPU seconds
    used of the budget, the steps (by ``model.loss_history``, when set), the loss at the
    grader's start and of the returned weights on the grader's sequences, the exact-match
    fraction reached there, and whether the weights came from the grader's start. Figures of
    the student's own model only: nothing a hidden test expects."""
    before = teacher_forced_loss(trained["start"], src, tgt)
    after = teacher_forced_loss(trained["state_dict"], src, tgt)
    cpu, budget = trained["cpu_s"], trained["budget_s"]
    history = trained.get("loss_history")
    steps = f"; {len(history)} steps by model.loss_history" if history else ""
    early = (" (it stopped with more than half of its budget left: there was time to train "
             "longer)" if cpu < 0.5 * budget else "")
    correlations = weight_correlations(trained["start"], trained["state_dict"])
    lowest = min(correlations.values()) if correlations else float("nan")
    start = ("the returned weights came from the grader's start (every weight matrix "
             f"correlates at least {lowest:.2f} with it)" if lowest >= CORRELATION_FLOOR else
             f"the returned weights did not come from the grader's start (a weight matrix "
             f"correlates only {lowest:.2f} with it: re-initialised or loaded?)")
    return (f"What the grader saw of your training: {cpu:.1f} of {budget:g} CPU seconds"
            f"{early}{steps}; loss {before:.2f} nats per token at the grader's start, "
            f"{after:.3f} for the returned weights; {exact:.1%} of the grader's held-out "
            f"sequences reversed exactly; {start}.")


HOW_LOSS_IS_COMPUTED = (
    "The grader's figure: cross-entropy in nats per target token, PAD targets ignored, with "
    "teacher forcing on held-out make_batch sequences (lengths 1-8): logits = "
    "model(src, tgt[:, :-1]) predict tgt[:, 1:] (BOS, reversed digits, EOS).")


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


def train_once(student, budget, training_start: int) -> dict:
    """The reply of the submission's one train(TRAIN_SEED, budget_s) run (shared by every
    outcome test), its models started from the grader's ``start_state(training_start)``,
    checked for its CPU time; a Mismatch that says why not. The reply gains "start" (the
    grader's initial weights: the trusted side's own copy) and "cpu_s" (the kernel's
    figure)."""
    limit = budget.cpu_s
    start = start_state(training_start)
    try:
        run = student.train("train", MODEL_CLASS, TRAIN_SEED, budget_s=limit,
                            initial_state=start)
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
    return {**value, "start": start, "cpu_s": run.cpu_s, "budget_s": limit}


def assert_loads(state_dict: dict) -> None:
    """The trained weights load strictly into the reference Seq2SeqTransformer(); a
    Mismatch naming the keys that differ (the hidden message without them)."""
    try:
        load_model(state_dict)
    except ValueError as exc:
        raise Mismatch(str(exc), "the returned model's state_dict does not load into the "
                                 "contract's Seq2SeqTransformer()") from None


def own_exact_fraction(student, state_dict: dict, src: torch.Tensor, tgt: torch.Tensor) -> float:
    """The fraction of rows the student's own greedy_decode (in the worker) reverses
    exactly with ``state_dict``; 0.0 if it fails (the module tests say why)."""
    try:
        model = student.module(MODEL_CLASS)
        model.load_state_dict(state_dict)
        out = model.method("greedy_decode", src, src.size(1) + 1)
    except StudentError:
        return 0.0
    if not (isinstance(out, torch.Tensor) and out.dim() == 2 and out.size(0) == tgt.size(0)):
        return 0.0
    padded = torch.full_like(tgt, PAD)
    width = min(out.size(1), tgt.size(1))
    padded[:, :width] = out[:, :width]
    return float((padded == tgt).all(dim=1).double().mean())


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

