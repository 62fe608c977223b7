"""Calls into another lab (#25): the whole lab reports of the fixtures that try them.

A lab imports only the contract functions of earlier labs; a call is answered by the
course's reference in a reference worker (bounded sizes, capped reply), refused during a
measured call; an honest import loses no points.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest
import torch

from helpers import grade, make_submission
from grader import paths
from grader.course import Course
from grader.engine.student import MAX_CALLBACK_SCALAR, Session
from grader.grading import Grader
from grader.sandbox import make_scratch, protocol
from grader.sandbox.channel import EndWorker

ATTACKS = paths.KIT / "tests" / "fixtures" / "attacks"


def _with_attack(name: str, dest):
    """The reference solutions overlaid with attack fixture ``name``'s files."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted((paths.KIT / "solutions").glob("lab*.py")):
        shutil.copyfile(f, dest / f.name)
    for f in sorted((ATTACKS / name).glob("*.py")):
        shutil.copyfile(f, dest / f.name)
    return dest


def test_a_later_lab_cannot_be_imported_and_the_message_says_what_can(rubric, zygote,
                                                                     tmp_path):
    """Lab 3 importing from lab 8 (a later lab): no points, and the import error
    names the later lab and the names lab 3 may import."""
    submission = _with_attack("atk_later_lab_given_code", tmp_path / "s")
    lab3 = grade(submission, rubric=rubric, zygote=zygote,
                 labs=["lab3_positional"]).lab("lab3_positional")
    assert lab3.score == 0, [(t.name, t.passed) for t in lab3.tests]
    # The import is inside the function: each test that calls it fails, saying why.
    told = [t.message for t in lab3.tests
            if "lab3_positional may not import lab8_train_transformer" in t.message]
    assert told, [t.message for t in lab3.tests]
    assert all("lab1_attention.scaled_dot_product_attention" in m for m in told), told[0]


@contextlib.contextmanager
def _answered_by_reference(rubric, zygote, submission=None):
    """A Session whose labs' calls into other labs the course's reference answers (the
    kit's solutions in a scratch folder); ``submission``: the student's folder (default:
    that same folder)."""
    with Grader(Course(paths.KIT, rubric), zygote=zygote) as grader:
        importable = grader._importable
    reference = make_scratch({f.name: f.read_bytes()
                              for f in (paths.KIT / "solutions").glob("lab*.py")})
    session = Session(zygote=zygote, submission_dir=str(submission or reference.name),
                      forbidden={}, importable=importable, reference_dir=reference.name)
    try:
        yield session
    finally:
        session.close()
        reference.cleanup()


def test_numbers_that_size_work_are_bounded_in_calls_into_other_labs(rubric, zygote):
    """A call sized by an integer past the bound is refused before any worker runs it;
    one inside the bound is answered by the reference worker."""
    with _answered_by_reference(rubric, zygote) as session:
        session.start_test(20, test="t", lab="lab2_multihead")
        with pytest.raises(ValueError, match="bounded by"):
            session._callback("lab2_multihead", protocol.callback_request(
                "lab1_attention", "causal_mask", [MAX_CALLBACK_SCALAR * 32], {}, 0))
        # 16384 x 16384 booleans is 256 MiB: past the reply cap, the worker's reply is refused.
        with pytest.raises(RuntimeError, match="course's lab1_attention"):
            session._callback("lab2_multihead", protocol.callback_request(
                "lab1_attention", "causal_mask", [16384, 16384], {}, 0))
        # The same integer as a tensor (0-d, one element, an integer vector) or a float
        # tensor of one element (torch.arange takes it): bounded the same (#25, item 4).
        for n in (torch.tensor(5_000_000), torch.tensor([5_000_000]),
                  torch.tensor([3, 5_000_000]), torch.tensor(5e6), torch.tensor([5e6]),
                  torch.tensor(-(2**63)), [torch.tensor(5_000_000)]):
            with pytest.raises(ValueError, match="bounded by"):
                session._callback("lab2_multihead", protocol.callback_request(
                    "lab1_attention", "causal_mask", [n, 1], {}, 0))
        small = session._callback("lab2_multihead", protocol.callback_request(
            "lab1_attention", "causal_mask", [torch.tensor(4)], {}, 0))
        assert tuple(small.shape) == (4, 4)
        small = session._callback("lab2_multihead", protocol.callback_request(
            "lab1_attention", "causal_mask", [4], {}, 0))
        assert tuple(small.shape) == (4, 4)
        # What one test may have relayed is capped (the grading process's CPU), saying so.
        assert session.relay_cap() == 20 * (256 << 20)      # 256 MiB a second of its limit
        session.relayed_bytes = session.relay_cap()
        with pytest.raises(ValueError, match="5120 MiB may move in this test"):
            session._callback("lab2_multihead", protocol.callback_request(
                "lab1_attention", "causal_mask", [torch.tensor(4)], {}, 0))
        # Told, and calling again: the worker is ended (the relay would read on for ever).
        with pytest.raises(EndWorker, match="called another lab again"):
            session._callback("lab2_multihead", protocol.callback_request(
                "lab1_attention", "causal_mask", [torch.tensor(4)], {}, 0))
        session.start_test(20, test="t2", lab="lab2_multihead")
        assert session.relayed_bytes == 0
        # A refused call's bytes were read all the same: they count against the cap.
        with pytest.raises(ValueError, match="not importable"):
            session._callback("lab2_multihead", protocol.callback_request(
                "lab1_attention", "nope", [torch.zeros(1000)], {}, 0))
        assert session.relayed_bytes == 4000
        assert session.fault is None, session.fault


def test_work_handed_to_lab1_fails_the_measured_tests_only(rubric, zygote, tmp_path):
    """Lab 6 handing its attention to lab 1: right values, but in a measured call what the
    reference worker used for it is the call's (#25): the (L, L) scores lab 1 builds are
    in the peak, and the memory test fails on them."""
    submission = make_submission("bug_lab6_memory_through_lab1", tmp_path / "s")
    lab6 = grade(submission, rubric=rubric, zygote=zygote,
                 labs=["lab6_efficient_attention"]).lab("lab6_efficient_attention")
    failed = {t.name: t.message for t in lab6.tests if not t.passed}
    assert "test_chunked_matches_full_attention" not in failed, failed
    assert "test_chunked_attention_memory_stays_linear" in failed, sorted(failed)
    assert all("memory" in name or "work" in name or "grows" in name for name in failed), \
        sorted(failed)
    public = failed["test_chunked_attention_memory_stays_linear"]
    assert "score matrix" in public and "as much was held" in public, public


@pytest.mark.slow
@pytest.mark.xdist_group("graded-ok_lab8_own_lab1")   # its grading (a training) is shared
def test_lab8_using_its_own_lab1_keeps_full_marks(graded):
    """Lab 8's Attention through lab 1's scaled_dot_product_attention: every call of its
    training answered, the reference's CPU time charged, within the budget: full marks."""
    result, _ = graded("ok_lab8_own_lab1", ["lab8_train_transformer"])
    lab8 = result.lab("lab8_train_transformer")
    assert lab8.score == lab8.max_score, [(t.name, t.message) for t in lab8.tests
                                          if not t.passed]


# A training whose work is lab 1's: at each step it asks lab 1 (the course's reference) for
# the attention of 256 queries over 256 keys, forward and backward, and stops by its own clock.
CLOCKED_TRAINING = """
import time
import torch
from lab1_attention import scaled_dot_product_attention


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))


def train(seed, budget_s):
    start = time.process_time()
    model = Tiny()
    q = torch.randn(1, 4, 256, 64, generator=torch.Generator().manual_seed(seed))
    model.loss_history = []
    while time.process_time() - start < 0.85 * budget_s:
        out, _ = scaled_dot_product_attention(q * model.scale, q, q)
        loss = out.square().mean()
        loss.backward()
        model.loss_history.append(float(loss))
    return model
"""


@pytest.mark.slow
def test_a_training_stopping_by_its_clock_is_charged_what_its_clock_showed(rubric, zygote,
                                                                           tmp_path):
    """time.process_time() in a worker counts the CPU time the course's reference spent
    answering its calls into other labs, and the grader charges a training that and its
    own (not the relay's framing): a training that stops by its clock at 85% of its budget
    is charged between 85% of the budget and the 10% + 1 s the budget test allows. On
    0188968 (the clock blind to the answers, the framing charged) a budget of 3 s was charged
    several times over."""
    budget = 3.0
    submission = tmp_path / "s"
    submission.mkdir()
    (submission / "lab8_train_transformer.py").write_text(CLOCKED_TRAINING)
    with _answered_by_reference(rubric, zygote, submission) as session:
        session.start_test(60, test="t", lab="lab8_train_transformer")
        value, used = session.train("lab8_train_transformer", protocol.train_request(
            "train", "Tiny", [0, budget], {}))
        steps = len(value["loss_history"])
        assert steps > 3, value["loss_history"]
        assert 0.85 * budget <= used.cpu_s <= 1.1 * budget + 1.0, (used.cpu_s, steps)
        assert session.fault is None, session.fault


@pytest.mark.slow
def test_a_measured_calls_relay_framing_is_not_charged_to_the_student(rubric, zygote,
                                                                     tmp_path):
    """The same 96 calls into lab 1, moving 4 MiB each (8192 keys) or 8 kB (16 keys), from
    a lab 2 that does no work of its own (benchmarks/bench_relay.py's, which prints the
    figures): the measured call is charged about the same CPU time, because moving the
    bytes that cross is the relay's (the grader's design), not the student's work; what is
    taken off was calibrated in a fresh worker whose lab is never imported and is reported
    (``relay_s``). Before the fix the 384 MiB cost the student ~0.65 CPU-s (copied three
    times in the worker, then by the kernel) against ~0.03 s for the small frames."""
    submission = tmp_path / "s"
    submission.mkdir()
    (submission / "lab2_multihead.py").write_text(_bench_relay().RELAYING)
    with _answered_by_reference(rubric, zygote, submission) as session:
        charged = {}
        for keys in (16, 8192, 16, 8192):
            session.start_test(60, test="t", lab="lab2_multihead")
            _, used = session.measure("lab2_multihead",
                                      protocol.call_request("relay", [keys, 96], {}))
            charged.setdefault(keys, []).append(used)
        small, big = (min(u.cpu_s for u in charged[k]) for k in (16, 8192))
        assert big - small < 0.1, (small, big, charged)
        assert all(u.relay_s > 0 for u in charged[8192]), charged
        assert session.fault is None, session.fault


def _bench_relay():
    """benchmarks/bench_relay.py as a module (its lab 2 source, ``RELAYING``)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "bench_relay", paths.KIT / "benchmarks" / "bench_relay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------- the grading process's peak

# The most a submission's calls into other labs may add to the grading process's peak
# resident memory, over the same grading of the reference (#25, item 2): the relay holds at
# most one request (4 Mi numbers: 32 MiB) and one reply (64 MiB) at a time, each returned
# to the kernel once sent.
RELAY_PEAK_BOUND_MB = 300
RELAY_FLOODS = ["atk_relay_floods_grader_memory", "atk_relay_mask_floods_grader_memory",
                "atk_relay_unread_replies_flood_grader_memory"]


def _grading_process_peak(submission, tmp_path, lab: str) -> tuple[float, float, dict]:
    """``grader grade --lab lab`` in a fresh process (every test's time limit 4 s): its peak
    resident memory (MB, VmHWM read from /proc from outside while it runs, every 20 ms),
    its CPU time (s, its own and its threads', not its workers') and its results."""
    import json
    import re
    import subprocess
    import sys
    import time

    rubric_path = tmp_path / "rubric.yaml"
    rubric_path.write_text(re.sub(r"time_limit_s:\s*[\d.]+", "time_limit_s: 4",
                                  (paths.KIT / "rubric.yaml").read_text()))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "grader.cli", "--rubric", str(rubric_path), "grade",
         str(submission), "--out", str(out), "--lab", lab],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path)
    peak_kb, ticks = 0, 0
    while proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            break
        found = re.search(r"VmHWM:\s+(\d+)", status)
        if found:
            peak_kb = max(peak_kb, int(found.group(1)))
            ticks = int(stat[11]) + int(stat[12])
        time.sleep(0.02)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    results = json.loads((out / "results.json").read_text())
    return peak_kb / 1024, ticks / os.sysconf("SC_CLK_TCK"), results


@pytest.fixture(scope="module")
def reference_grading_peak(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference")
    submission = tmp / "s"
    submission.mkdir()
    for f in sorted((paths.KIT / "solutions").glob("lab*.py")):
        shutil.copyfile(f, submission / f.name)
    peak, cpu, _ = _grading_process_peak(submission, tmp, "lab2_multihead")
    return peak, cpu


@pytest.mark.slow
@pytest.mark.parametrize("name", RELAY_FLOODS)
def test_calls_into_other_labs_leave_the_grading_process_within_a_fixed_bound(
        name, tmp_path, reference_grading_peak):
    """Replies near the cap, asked again and again, or asked without reading the answers:
    the grading process's peak stays within RELAY_PEAK_BOUND_MB of the reference's grading
    (on main: 1643, 1546 and 2883 MB against 259 MB)."""
    base_peak, _base_cpu = reference_grading_peak
    submission = _with_attack(name, tmp_path / "s")
    peak, cpu, results = _grading_process_peak(submission, tmp_path, "lab2_multihead")
    assert results["extra_data"]["labs"]["lab2_multihead"]["score"] == 0
    assert peak < base_peak + RELAY_PEAK_BOUND_MB, (name, peak, base_peak, cpu)
