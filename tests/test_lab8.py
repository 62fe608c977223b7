"""Lab 8's outcome grading: the protocol's train op, the evidence of training, the budget.

The protocol tests run ``protocol.answer`` in this process on a tiny model (milliseconds).
The grading tests train lab 8 in sandbox workers (the reference: ~15 CPU s; tests/conftest.py
shares a training between identical lab files); the ones that must train afresh are slow.
"""

from __future__ import annotations

import dataclasses
import re
import uuid

import pytest
import torch
import torch.nn as nn

from helpers import grade, make_submission
from grader import paths
from grader.engine.student import Session
from grader.sandbox import protocol
from grader.suites import _training
from grader.suites._inputs import LAB8_CFG, digit_sources, seq2seq_weights, target_prefixes

LAB = "lab8_train_transformer"
OUTCOME_TESTS = {"test_train_returns_a_trained_model_within_budget",
                 "test_trained_model_reverses_half_of_heldout",
                 "test_trained_model_reverses_80_percent_of_heldout",
                 "test_trained_model_reverses_95_percent_of_heldout"}


# ------------------------------------------------------------------------------ the protocol

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x)


GIVEN = {"lin.weight": torch.full((2, 3), 0.25), "lin.bias": torch.tensor([1.0, -1.0])}


def _answer(train, cls=Tiny, start=GIVEN):
    names = {"train": train, "Tiny": cls}
    req = protocol.train_request("train", "Tiny", [0], {"budget_s": 1.0}, initial_state=start)
    return protocol.answer(names.get, req, "tiny.py")


def test_every_model_built_in_train_starts_from_the_grader_state():
    seen = []

    def train(seed, budget_s):
        model = Tiny()
        seen.append({k: v.clone() for k, v in model.state_dict().items()})
        seen.append(Tiny().lin.weight.clone())            # a second model: the same start
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model.loss_history = []
        for _ in range(3):
            loss = model(torch.ones(4, 3)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            model.loss_history.append(loss)               # tensors: sent as floats
        return model

    reply = _answer(train)
    assert set(reply) == {"state_dict", "loss_history", "pad_probe"}   # nothing of the start
    assert all(torch.equal(seen[0][k], GIVEN[k]) for k in GIVEN)
    assert torch.equal(seen[1], GIVEN["lin.weight"])
    assert not torch.equal(reply["state_dict"]["lin.weight"], GIVEN["lin.weight"])
    assert len(reply["loss_history"]) == 3
    assert all(type(v) is float for v in reply["loss_history"])
    # Nothing stays behind: the class's own __init__ again, and models built later are
    # the class's own.
    assert "__init__" in Tiny.__dict__ and Tiny.__init__.__qualname__ == "Tiny.__init__"
    assert not torch.equal(Tiny().lin.weight, GIVEN["lin.weight"])


def test_a_model_of_other_sizes_keeps_its_own_weights():
    class Sized(nn.Module):
        def __init__(self, width=3):
            super().__init__()
            self.lin = nn.Linear(width, 2)

    def train(seed, budget_s):
        wide = Sized(5)
        assert wide.lin.weight.shape == (2, 5) and not bool((wide.lin.weight == 0.25).all())
        return Sized()

    reply = protocol.answer({"train": train, "Sized": Sized}.get,
                            protocol.train_request("train", "Sized", [0], {"budget_s": 1.0},
                                                   initial_state=GIVEN), "sized.py")
    assert torch.equal(reply["state_dict"]["lin.weight"], GIVEN["lin.weight"])


def test_a_subclass_of_the_model_class_starts_from_it_too():
    class Mine(Tiny):
        def forward(self, x):
            return 2 * super().forward(x)

    def train(seed, budget_s):
        return Mine()

    reply = _answer(train)
    assert torch.equal(reply["state_dict"]["lin.bias"], GIVEN["lin.bias"])


def test_the_grader_start_is_the_default_initialisation_of_the_contract_model():
    """Drawn without the reference (a release has none), yet the state dict the default
    Seq2SeqTransformer() has: the same names and shapes (loaded strictly), at the default
    initialisation's scale; a different start for every seed."""
    model = _training.reference().Seq2SeqTransformer()
    own = model.state_dict()
    start = _training.start_state(11)
    assert list(start) == list(own) and all(start[k].shape == own[k].shape for k in own)
    model.load_state_dict(start, strict=True)
    for name in ("src_emb.weight", "encoder.0.ff.2.weight", "decoder.1.cross_attn.v_proj.bias"):
        assert abs(float(start[name].std()) / float(own[name].std()) - 1) < 0.15, name
    other = _training.start_state(12)
    assert not torch.equal(start["out.weight"], other["out.weight"])


class TinySeq(nn.Module):
    """The given modules the PAD probe watches: tgt_emb (tokens in) and out (logits)."""

    def __init__(self):
        super().__init__()
        self.tgt_emb = nn.Embedding(13, 4)
        self.out = nn.Linear(4, 13)

    def forward(self, tgt_in):
        return self.out(self.tgt_emb(tgt_in))


@pytest.mark.parametrize("ignore_pad", [True, False])
def test_the_first_step_that_reads_pad_shows_whether_the_loss_ignores_it(ignore_pad):
    tgt = torch.tensor([[10, 3, 11, 12, 12], [10, 4, 5, 6, 11]])

    def train(seed, budget_s):
        model = TinySeq()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            logits = model(tgt[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, 13), tgt[:, 1:].reshape(-1),
                                               ignore_index=12 if ignore_pad else -100)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return model

    start = {k: v.clone() for k, v in TinySeq().state_dict().items()}
    reply = protocol.answer({"train": train, "TinySeq": TinySeq}.get,
                            protocol.train_request("train", "TinySeq", [0], {"budget_s": 1.0},
                                                   initial_state=start), "tiny.py")
    probe = reply["pad_probe"]
    assert probe["pad_positions"] == 1 and probe["real_grad"] > 0
    assert (probe["pad_grad"] == 0.0) == ignore_pad
    problems = _training.pad_loss_problems(reply)
    assert bool(problems) == (not ignore_pad)
    assert all("your loss counts PAD targets" in p for p in problems)


def _trained_from(start: dict, steps: int, **optimiser) -> dict:
    """The reference model trained ``steps`` steps of its own loop from ``start`` (one
    thread, a fixed seed: the same weights every run), with AdamW(**optimiser)."""
    torch.manual_seed(8)
    generator = torch.Generator().manual_seed(8)
    ref = _training.reference()
    model = ref.Seq2SeqTransformer()
    model.load_state_dict(start)
    opt = torch.optim.AdamW(model.parameters(), betas=(0.9, 0.98), **optimiser)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.train()
        for _ in range(steps):
            src, tgt = ref.make_batch(64, 1, 8, generator)
            logits = model(src, tgt[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                               tgt[:, 1:].reshape(-1), ignore_index=ref.PAD)
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow   # trains: ~30 CPU s
def test_large_honest_steps_from_the_grader_start_are_evidence_of_training():
    """A constant rate of 1e-2 with weight decay: honest training that moves far from the
    start (median parameter correlation with it ~0.33, its lowest matrix ~0.20; #27 asked
    0.4 and 0.25 and it lost the 10 outcome points). What its matrices compute still goes
    much through the start's (pooled ~0.45), so it keeps them. The same weights mixed into
    another start, as if shipped and blended: not through that start, and no longer
    trained."""
    start = _training.start_state(1234)
    src, tgt = _training.heldout(torch.Generator().manual_seed(1), n=256)
    honest = _trained_from(start, 1100, lr=1e-2, weight_decay=0.05)
    correlations = sorted(_training.weight_correlations(start, honest).values())
    assert correlations[len(correlations) // 2] < 0.4                  # the hard case
    before = _training.teacher_forced_loss(start, src, tgt)
    assert _training.teacher_forced_loss(honest, src, tgt) < 0.1 * before
    pooled, per_matrix = _training.functional_correlations(start, honest, src, tgt)
    assert pooled >= _training.FUNCTIONAL_MIN, (pooled, per_matrix)
    assert _training.training_problems({"start": start, "state_dict": honest}, src, tgt) == []
    other = _training.start_state(99)
    blended = {k: v + 0.35 * other[k] if v.dim() == 2 else v for k, v in honest.items()}
    problems = _training.training_problems({"start": other, "state_dict": blended}, src, tgt)
    assert any("do not work through the start" in p for p in problems), problems


@pytest.mark.slow   # trains: ~5 CPU s
def test_a_start_kept_where_it_computes_nothing_is_no_evidence_of_training():
    """Weights that hold the grader's start only in entries that multiply an exact zero
    (here: residual dims 0-31, every LayerNorm's gain and bias at 0 there, so every matrix
    that reads a LayerNorm's output reads zeros in its columns 0-31), and weights trained
    from another start in the rest: the matrices correlate with the start (parameters), and
    the model computes the same whatever the start. Not through the start."""
    start = _training.start_state(1234)
    src, tgt = _training.heldout(torch.Generator().manual_seed(2), n=128)
    trained_elsewhere = _trained_from(_training.start_state(4321), 300, lr=3e-3)
    reads_a_norm = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "ff.0.weight",
                    "out.weight")

    def forge(fill: dict) -> dict:
        forged = {}
        for name, value in trained_elsewhere.items():
            value = value.clone()
            if ".norm" in name or name.startswith("norm_"):
                value[:32] = 0                               # dims 0-31 read as zeros
            elif name.endswith(reads_a_norm):
                value[:, :32] = fill[name][:, :32]           # what they multiply: zeros
            forged[name] = value
        return forged

    forged = forge(start)
    parameter = sorted(_training.weight_correlations(start, forged).values())
    assert parameter[len(parameter) // 2] > 0.3, parameter     # the start is there...
    pooled, per_matrix = _training.functional_correlations(start, forged, src, tgt)
    assert pooled < _training.FUNCTIONAL_MIN, (pooled, per_matrix)   # ...doing nothing
    # Another start in the same entries: the same model, to the last bit of the loss.
    swapped = forge(_training.start_state(7))
    assert _training.teacher_forced_loss(swapped, src, tgt) == \
        _training.teacher_forced_loss(forged, src, tgt)
    problems = _training.training_problems({"start": start, "state_dict": forged}, src, tgt)
    assert any("do not work through the start" in p for p in problems), problems


def test_weights_that_did_not_move_from_the_start_show_no_training():
    start = _training.start_state(5)
    src, tgt = _training.heldout(torch.Generator().manual_seed(1), n=64)
    problems = _training.training_problems({"start": start, "state_dict": start}, src, tgt)
    assert len(problems) == 1 and "did not lower the loss" in problems[0]
    assert "tgt[:, 1:]" in problems[0]


def test_train_must_return_the_model_class_and_not_too_many_numbers(monkeypatch):
    with pytest.raises(TypeError, match="returned a dict, not the Tiny"):
        _answer(lambda seed, budget_s: {"lin.weight": torch.zeros(2, 3)})
    monkeypatch.setattr(protocol, "MAX_TRAINED_NUMBERS", 7)
    with pytest.raises(ValueError, match="holds 8 numbers, more than the 7"):
        _answer(lambda seed, budget_s: Tiny())


def test_a_loss_history_that_is_not_numbers_is_dropped():
    def train(seed, budget_s):
        model = Tiny()
        model.loss_history = [0.5, "not a number"]
        return model

    assert _answer(train)["loss_history"] is None


def test_train_is_never_replayed_by_the_mistake_catalogue():
    from grader.mistakes import Impl, ReplayError, replay
    with pytest.raises(ReplayError):
        replay(Impl(LAB), protocol.train_request("train", "Seq2SeqTransformer", [0], {}))


# ------------------------------------------------------------------------------ grading

def _lab8_rubric(rubric, *, cpu_s=None, time_limit_s=None):
    """The course rubric with lab 8's outcome tests given another budget / time limit."""
    lab = rubric.labs[LAB]
    tests = {}
    for name, test in lab.tests.items():
        if name in OUTCOME_TESTS:
            if cpu_s is not None:
                test = dataclasses.replace(test, budget=dataclasses.replace(test.budget,
                                                                            cpu_s=cpu_s))
            if time_limit_s is not None:
                test = dataclasses.replace(test, time_limit_s=time_limit_s)
        tests[name] = test
    return dataclasses.replace(rubric, labs={**rubric.labs,
                                             LAB: dataclasses.replace(lab, tests=tests)})


def _with_train(tmp_path, body: str):
    """The reference lab 8 whose train() is ``body`` (a function's source)."""
    sub = make_submission("ok_lab8_einsum", tmp_path / "sub")
    source = ((paths.KIT / "solutions") / f"{LAB}.py").read_text()
    (sub / f"{LAB}.py").write_text(source.split("\ndef train(")[0] + "\n" + body)
    return sub


def _tests(result):
    return {t.name: t for t in result.lab(LAB).tests}


def test_hand_set_weights_earn_no_outcome_points(rubric, zygote, tmp_path):
    """Weights computed before train() was called, loaded after a faked first forward: the
    module tests pass, every outcome test fails, and the public one says why."""
    result = grade(make_submission("atk_hand_set_weights", tmp_path / "atk"), rubric=rubric,
                   zygote=zygote, labs=[LAB])
    tests = _tests(result)
    assert {n for n, t in tests.items() if not t.passed} == OUTCOME_TESTS
    public = tests["test_train_returns_a_trained_model_within_budget"].message
    assert "did not come from the start the grader gave train()" in public


def test_train_past_its_budget_loses_the_outcome_points_with_the_reason(rubric, zygote,
                                                                         tmp_path):
    sub = _with_train(tmp_path, '''
def train(seed, budget_s=60.0):
    import time
    model = Seq2SeqTransformer()
    model.loss_history = [2.6, 2.0, float(torch.get_num_threads())]
    start = time.process_time()
    while time.process_time() - start < 3 * budget_s:
        pass
    return model
''')
    result = grade(sub, rubric=_lab8_rubric(rubric, cpu_s=1.0, time_limit_s=30.0),
                   zygote=zygote, labs=[LAB])
    tests = _tests(result)
    assert {n for n, t in tests.items() if not t.passed} == OUTCOME_TESTS
    public = tests["test_train_returns_a_trained_model_within_budget"]
    assert "more than its budget of 1 CPU" in public.message
    assert "time.process_time()" in public.message
    # The loss history came back as numbers and is drawn for the failed public test; its
    # last entry is the worker's torch thread count: train() runs on one thread.
    (curve,) = public.artifacts
    assert curve["x"] == [1, 2, 3] and curve["yours"] == [2.6, 2.0, 1.0]
    hidden = tests["test_trained_model_reverses_95_percent_of_heldout"]
    assert "budget of 1 CPU seconds" in hidden.message and not hidden.artifacts


def test_a_train_that_never_returns_is_stopped_with_the_reason(rubric, zygote, tmp_path):
    sub = _with_train(tmp_path, '''
def train(seed, budget_s=60.0):
    while True:
        pass
''')
    result = grade(sub, rubric=_lab8_rubric(rubric, cpu_s=1.0, time_limit_s=3.0),
                   zygote=zygote, labs=[LAB])
    tests = _tests(result)
    assert {n for n, t in tests.items() if not t.passed} == OUTCOME_TESTS
    for name in OUTCOME_TESTS:
        assert "train did not return within 1 CPU seconds" in tests[name].message, name


@pytest.mark.slow
def test_train_runs_once_per_submission_and_is_deterministic(rubric, zygote, tmp_path,
                                                             monkeypatch):
    """The four outcome tests share one training; the same file and seed train the same
    weights in another worker. (A fresh file: the tests' shared trainings do not apply.)"""
    source = ((paths.KIT / "solutions") / f"{LAB}.py").read_text() + f"\n# {uuid.uuid4()}\n"
    replies = []
    original = getattr(Session._train_once, "__wrapped__", Session._train_once)

    def counted(self, lab, req):
        got = original(self, lab, req)
        replies.append(got)
        return got

    monkeypatch.setattr(Session, "_train_once", counted)
    for run in ("a", "b"):
        sub = make_submission("ok_lab8_einsum", tmp_path / run)
        (sub / f"{LAB}.py").write_text(source)
        result = grade(sub, rubric=rubric, zygote=zygote, labs=[LAB])
        assert result.lab(LAB).score == result.lab(LAB).max_score
    assert len(replies) == 2                       # one per submission, not one per test
    (a, _), (b, _) = replies
    assert a["state_dict"].keys() == b["state_dict"].keys()
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    assert a["loss_history"] == b["loss_history"]


def test_lab8_mistake_implementations_without_the_mistake_are_the_reference():
    """The wrong models with every switch right compute the reference's logits, so each
    mistake differs from the reference by its one switch only."""
    from grader.mistakes import lab8_train_transformer as wrong
    ref = _training.reference()
    gen = torch.Generator().manual_seed(3)
    sd = seq2seq_weights(gen)
    src, tgt_in = digit_sources(gen, [5, 2]), target_prefixes(gen, 2, 6)
    layer = wrong.decoder_layer_class(ref.DecoderLayer)
    right = wrong.model_class(ref.Seq2SeqTransformer, layer=layer)(*LAB8_CFG)
    right.load_state_dict(sd)
    expected = ref.Seq2SeqTransformer(*LAB8_CFG)
    expected.load_state_dict(sd)
    with torch.no_grad():
        assert torch.allclose(right(src, tgt_in), expected(src, tgt_in), atol=1e-6)


def test_a_passed_training_test_shows_the_loss_curve(rubric, zygote, tmp_path):
    """The reference sets model.loss_history: its public training test passes and keeps the
    curve (one value per step, thinned to at most 200 points), drawn in the HTML report;
    the hidden outcome tests keep no picture."""
    from grader.diagnose import LOSS_POINTS
    from grader.outputs.html import render_feedback_html
    result = grade((paths.KIT / "solutions"), rubric=rubric, zygote=zygote, labs=[LAB])
    tests = _tests(result)
    assert result.lab(LAB).score == result.lab(LAB).max_score
    (curve,) = tests["test_train_returns_a_trained_model_within_budget"].artifacts
    assert "training loss" in curve["title"] and 10 < len(curve["x"]) <= LOSS_POINTS
    assert curve["yours"][0] > 2.0 > 0.1 > curve["yours"][-1]
    assert all(not t.artifacts for t in tests.values() if t.visibility == "hidden")
    html = render_feedback_html(result)
    assert 'data-pictures-for="test_train_returns_a_trained_model_within_budget"' in html
    # The training's figures (#27 item 5), in the passed test's message: CPU seconds of the
    # budget, the loss at the grader's start and after, exact reversals, the hidden tiers.
    report = tests["test_train_returns_a_trained_model_within_budget"].message
    assert re.search(r"Your training: [\d.]+ of 40 CPU seconds", report), report
    assert "at the grader's start" in report and "50% / 80% / 95%" in report
    assert re.search(r"reverses (9\d|100)\.\d% of 256 public held-out", report), report
    assert "Your training:" in html
    from grader.outputs.gradescope import write_gradescope
    write_gradescope(result, tmp_path / "results.json")
    assert "Your training:" in (tmp_path / "results.json").read_text()


@pytest.mark.parametrize("name, passes", [("ok_lab8_decode_full_width", True),
                                          ("bug_lab8_decode_tokens_after_eos", False)])
def test_greedy_decode_may_run_to_full_width_with_pad_after_eos(name, passes, rubric, zygote,
                                                                tmp_path):
    """The contract's "(B, <= 1 + max_new_tokens) ... stopping per row at EOS (PAD after
    it)": a decode that runs on to full width with PAD after each row's EOS passes both
    decode tests; one that writes tokens after EOS fails them (#27 item 3)."""
    result = grade(make_submission(name, tmp_path / name), zygote=zygote, labs=[LAB],
                   rubric=_lab8_rubric(rubric, cpu_s=1.0, time_limit_s=30.0))
    tests = _tests(result)
    for test in ("test_greedy_decode_matches_reference", "test_greedy_decode_stops_per_row_at_eos"):
        if passes:
            assert tests[test].passed, tests[test].message
    assert tests["test_greedy_decode_stops_per_row_at_eos"].passed == passes


def test_a_loss_that_counts_pad_loses_the_training_test(rubric, zygote, tmp_path):
    """#27 item 4: the contract's "cross-entropy ignoring PAD", seen through the gradient of
    the first training step at the positions where the decoder read PAD."""
    result = grade(make_submission("bug_lab8_loss_counts_pad", tmp_path / "pad"), zygote=zygote,
                   labs=[LAB], rubric=_lab8_rubric(rubric, cpu_s=3.0, time_limit_s=30.0))
    public = _tests(result)["test_train_returns_a_trained_model_within_budget"]
    assert not public.passed and "your loss counts PAD targets" in public.message
    assert "ignore_index=PAD" in public.message
    right = grade(make_submission("ok_lab8_einsum", tmp_path / "ok"), zygote=zygote,
                  labs=[LAB], rubric=_lab8_rubric(rubric, cpu_s=3.0, time_limit_s=30.0))
    assert "counts PAD" not in _tests(right)["test_train_returns_a_trained_model_within_budget"].message


def test_the_tests_shared_trainings_keep_successes_only(tmp_path):
    """tests/conftest.py shares lab 8 trainings between tests (helpers.SharedTrainings): a
    failed or timed-out training must go back to its own test only, and the next test with
    the same file train again; a success is reused; another file or request trains anew."""
    from types import SimpleNamespace

    from helpers import SharedTrainings
    from grader.engine.student import StudentError

    (tmp_path / f"{LAB}.py").write_text("# a lab file\n")
    session = SimpleNamespace(submission_dir=str(tmp_path))
    replies = [StudentError(kind="timeout", lab=LAB, message="train did not return"),
               ({"weights": 1}, "measured"), ({"weights": 2}, "measured")]
    calls = []

    def original(session, lab, req):
        calls.append(req)
        return replies[len(calls) - 1]

    shared = SharedTrainings(original)
    train = shared.method()
    assert train.__wrapped__ is original
    req = {"op": "train", "seed": 0}
    assert isinstance(train(session, LAB, req), StudentError)
    assert train(session, LAB, req) == ({"weights": 1}, "measured")     # trained again
    assert train(session, LAB, req) == ({"weights": 1}, "measured")     # reused
    assert len(calls) == 2
    assert train(session, LAB, {"op": "train", "seed": 1}) == ({"weights": 2}, "measured")
    assert len(calls) == 3


def test_the_per_row_eos_case_catches_tokens_after_eos_at_every_course_secret():
    """The hidden per-row EOS test draws its weights from the course's generator. Before,
    a draw was taken once its expected tokens held a PAD; at 2 of 60 generators that PAD
    was a generated token, or the argmax after EOS was PAD, and a decode that keeps its
    argmax tokens after EOS passed (bug_lab8_decode_tokens_after_eos passed in a full run).
    Now the drawn case separates that decode from the reference's at every generator."""
    import importlib.util

    path = paths.KIT / "grader" / "suites" / "hidden" / "test_lab8_train_transformer.py"
    spec = importlib.util.spec_from_file_location("hidden_lab8_for_test", path)
    hidden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hidden)
    from grader.suites._inputs import same_decoding

    for seed in range(60):
        sd, src, expected = hidden.per_row_eos_case(torch.Generator().manual_seed(seed))
        keeps_tokens = hidden._without_pad_after_eos(sd, src, 10)
        assert expected.size(1) > 2, seed
        assert not same_decoding(keeps_tokens, expected, 10), \
            f"generator {seed}: tokens after EOS decode as the reference's"


def test_an_outcome_test_says_what_the_training_did(rubric, zygote, tmp_path):
    """#42: a train that re-initialises the grader's start and stops after a few steps is
    told so in every outcome test: the CPU seconds used of the budget (and that it stopped
    early), its steps by loss_history, the loss at the start and after, the fraction
    reached, and that the weights did not come from the grader's start."""
    sub = _with_train(tmp_path, '''
def train(seed, budget_s=60.0):
    torch.manual_seed(seed)
    model = Seq2SeqTransformer()
    for p in model.parameters():            # re-initialised: the grader's start discarded
        torch.nn.init.normal_(p, std=0.05)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    model.loss_history = []
    for _ in range(60):
        src, tgt = make_batch(64, 1, 8, gen)
        logits = model(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), tgt[:, 1:].reshape(-1),
                               ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.loss_history.append(float(loss))
    return model
''')
    tests = _tests(grade(sub, rubric=rubric, zygote=zygote, labs=[LAB]))
    assert {n for n, t in tests.items() if not t.passed} >= OUTCOME_TESTS - {
        "test_train_returns_a_trained_model_within_budget"}
    for name in OUTCOME_TESTS - {"test_train_returns_a_trained_model_within_budget"}:
        message = tests[name].message
        assert "What the grader saw of your training: " in message, (name, message)
        for words in ("of 40 CPU seconds (it stopped with more than half of its budget left",
                      "; 60 steps by model.loss_history; loss ", "nats per token at the "
                      "grader's start", "of the grader's held-out sequences reversed exactly",
                      "the returned weights did not come from the grader's start"):
            assert words in message, (name, words, message)
