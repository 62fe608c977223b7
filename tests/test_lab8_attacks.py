"""Lab 8's budget and evidence of training against attacks (helper h-atk's probes).

Budget (1 CPU s): work at import time and in threads is counted (these pass); work in a
child process is not (tests/fixtures/submissions/atk_lab8_train_in_child scores 25/25 with
0.05 CPU s measured): that case fails until ``_training.train_once`` refuses, or counts,
other processes.

Evidence: a NaN loss passes both ``before < INITIAL_LOSS_MIN`` and ``after > LOSS_DROP *
before`` (every comparison with NaN is False), so a snapshot or a returned state with a NaN
in a 1-D parameter (no correlation looks at those) passes the evidence; these fail until the
checks fail closed on non-finite losses.
"""

from __future__ import annotations

import pytest
import torch

from helpers import grade
from grader.suites import _training
from test_lab8 import LAB, _lab8_rubric, _tests, _with_train

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


@pytest.mark.parametrize("where", ["initial", "final"])
def test_a_nan_loss_is_never_evidence_of_training(where):
    """Neither state trained at all: only a NaN output bias in one of them."""
    fresh = _fresh_state()
    reply = {"initial": _with_nan_bias(fresh) if where == "initial" else fresh,
             "state_dict": _with_nan_bias(fresh) if where == "final" else fresh}
    src, tgt = _training.heldout(torch.Generator().manual_seed(1), n=64)
    assert _training.training_problems(reply, src, tgt), \
        f"a NaN loss in the {where} state was taken as evidence of training"
