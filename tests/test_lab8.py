"""Lab 8's outcome grading: the protocol's train op, the evidence of training, the budget.

The protocol tests run ``protocol.answer`` in this process on a tiny model (milliseconds).
The grading tests train lab 8 in sandbox workers (the reference: ~15 CPU s; tests/conftest.py
shares a training between identical lab files); the ones that must train afresh are slow.
"""

from __future__ import annotations

import dataclasses
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


def _answer(train, cls=Tiny):
    names = {"train": train, "Tiny": cls}
    req = protocol.train_request("train", "Tiny", [0], {"budget_s": 1.0})
    return protocol.answer(names.get, req, "tiny.py")


def test_train_reply_holds_the_weights_from_just_before_the_first_step():
    seen = {}

    def train(seed, budget_s):
        model = Tiny()
        nn.init.constant_(model.lin.weight, 0.5)          # an honest re-initialisation
        seen["start"] = {k: v.clone() for k, v in model.state_dict().items()}
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
    assert set(reply) == {"state_dict", "initial", "loss_history"}
    assert torch.equal(reply["initial"]["lin.weight"], seen["start"]["lin.weight"])
    assert not torch.equal(reply["state_dict"]["lin.weight"], seen["start"]["lin.weight"])
    assert len(reply["loss_history"]) == 3
    assert all(type(v) is float for v in reply["loss_history"])
    # Nothing of the watch stays behind: the class's __init__ and the model's hooks.
    assert "__init__" in Tiny.__dict__ and Tiny.__init__.__qualname__ == "Tiny.__init__"
    model = Tiny()
    assert not model._forward_pre_hooks and not model.lin._forward_pre_hooks


def test_an_optimizer_step_alone_is_seen_as_the_start_of_training():
    def train(seed, budget_s):
        model = Tiny()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.no_grad():
            model.lin.weight.fill_(2.0)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        return model

    reply = _answer(train)
    assert bool((reply["initial"]["lin.weight"] == 2.0).all())
    assert bool((reply["state_dict"]["lin.weight"] == 1.9).all())


def test_a_subclass_of_the_model_class_is_watched_too():
    class Mine(Tiny):
        def __init__(self):
            super().__init__()
            self.extra = nn.Linear(2, 2)

        def forward(self, x):
            return self.extra(super().forward(x))

    def train(seed, budget_s):
        model = Mine()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(torch.ones(4, 3)).pow(2).mean()
        loss.backward()
        opt.step()
        return model

    reply = _answer(train)
    assert reply["initial"] is not None and set(reply["initial"]) == set(reply["state_dict"])


def test_a_model_that_never_trained_has_no_snapshot():
    def train(seed, budget_s):
        model = Tiny()
        with torch.no_grad():
            model(torch.ones(1, 3))                       # no gradients: not a training step
        return model

    reply = _answer(train)
    assert reply["initial"] is None and reply["loss_history"] is None
    problems = _training.training_problems(reply, None, None)
    assert len(problems) == 1 and "no training step was seen" in problems[0]


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
    assert "not reachable from the initial ones" in public


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


def test_a_passed_training_test_shows_the_loss_curve(rubric, zygote):
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
    assert 'data-pictures-for="test_train_returns_a_trained_model_within_budget"' in \
        render_feedback_html(result)


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
