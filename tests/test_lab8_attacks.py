"""Lab 8's budget and evidence of training against attacks (helper h-atk's probes).

Budget (1 CPU s): work at import time and in threads is counted (these pass); work in a
child process is not (tests/fixtures/submissions/atk_lab8_train_in_child scores 25/25 with
0.05 CPU s measured): that case fails until ``_training.train_once`` refuses, or counts,
other processes.

Evidence: a NaN loss passes ``after > LOSS_DROP * before`` (every comparison with NaN is
False), so a returned state with a NaN in a 1-D parameter (no correlation looks at those)
passed the evidence until the checks failed closed on non-finite losses.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from helpers import grade
from grader import paths
from grader.suites import _training
from test_lab8 import LAB, OUTCOME_TESTS, _lab8_rubric, _tests, _with_train

BURN = '''
def _burn(seconds):
    import time
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
'''

CASES = {
    "import": BURN + "\n_burn(3.0)\n\ndef train(seed, budget_s=60.0):\n    return Seq2SeqTransformer()\n",
    "thread": BURN + '''
def train(seed, budget_s=60.0):
    import threading
    worker = threading.Thread(target=_burn, args=(3.0,))
    worker.start()
    worker.join()
    return Seq2SeqTransformer()
''',
    "child": BURN + '''
def train(seed, budget_s=60.0):
    import os
    pid = os.fork()
    if pid == 0:
        try:
            _burn(3.0)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return Seq2SeqTransformer()
''',
}


@pytest.mark.parametrize("where", sorted(CASES))
def test_cpu_spent_anywhere_by_train_counts_in_its_budget(where, rubric, zygote, tmp_path):
    sub = _with_train(tmp_path, CASES[where])
    result = grade(sub, rubric=_lab8_rubric(rubric, cpu_s=1.0, time_limit_s=30.0),
                   zygote=zygote, labs=[LAB])
    public = _tests(result)["test_train_returns_a_trained_model_within_budget"]
    assert not public.passed
    assert "budget" in public.message or "process" in public.message, public.message


def _fresh_state() -> dict:
    torch.manual_seed(0)
    model = getattr(_training.reference(), _training.MODEL_CLASS)()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _with_nan_bias(state: dict) -> dict:
    state = {k: v.clone() for k, v in state.items()}
    state["out.bias"].fill_(float("nan"))
    return state


def test_a_nan_loss_is_never_evidence_of_training():
    """The returned state did not train at all: only a NaN output bias in it."""
    fresh = _fresh_state()
    reply = {"start": fresh, "state_dict": _with_nan_bias(fresh)}
    src, tgt = _training.heldout(torch.Generator().manual_seed(1), n=64)
    assert _training.training_problems(reply, src, tgt), \
        "a NaN loss in the returned state was taken as evidence of training"


# ------------------------------------------------------------------ the grader's start (#27)

ATTACKS = Path(__file__).parent / "fixtures" / "attacks"
MODULE_TESTS_PASS = 15      # lab 8's points outside the four outcome tests


def _attack_submission(name: str, dest: Path) -> Path:
    """The reference solutions overlaid with tests/fixtures/attacks/<name>'s files."""
    dest.mkdir(parents=True)
    for f in sorted((paths.KIT / "solutions").glob("lab*.py")):
        shutil.copyfile(f, dest / f.name)
    for f in sorted((ATTACKS / name).glob("*.py")):
        shutil.copyfile(f, dest / f.name)
    return dest


@pytest.mark.parametrize("name", ["atk_lab8_shipped_float16", "atk_lab8_blended_start",
                                  "atk_lab8_silenced_layers_keep_start",
                                  "atk_lab8_dead_entries_hold_start",
                                  "atk_lab8_dead_entries_break_without_start"])
def test_weights_not_trained_from_the_grader_start_earn_no_outcome_points(name, rubric, zygote,
                                                                          tmp_path):
    """Weights trained once elsewhere and shipped in the file as float16 (with a forged
    "before training" snapshot), alone, mixed with the grader's start, or holding it where
    it computes nothing (silenced layers, entries that multiply an exact zero) so that the
    correlations look trained: the module tests pass, every outcome test fails, and the
    public one says the weights do not work through the grader's start or did not train."""
    result = grade(_attack_submission(name, tmp_path / name), rubric=rubric, zygote=zygote,
                   labs=[LAB])
    tests = _tests(result)
    assert {n for n, t in tests.items() if not t.passed} == OUTCOME_TESTS, \
        {n: t.message for n, t in tests.items() if not t.passed}
    assert result.lab(LAB).score == MODULE_TESTS_PASS
    public = tests["test_train_returns_a_trained_model_within_budget"].message
    assert "do not work through the start the grader gave train()" in public \
        or "did not come from the start the grader gave train()" in public \
        or "did not lower the loss enough" in public, public
