"""Calls sent ahead (grader/call_plan.py): the same grades as one call at a time, and the
paths where a test does not follow the plan (other requests, an early stop, a hang)."""

from __future__ import annotations

import time

import pytest

from conftest import make_submission
from grader import paths
from grader.call_plan import CallPlan, PlannedCall, plan_for
from grader.grading import grade_submission
from grader.sandbox import make_scratch, wire
from grader.student import Session, StudentLab, StudentTimeout
from grader.suite_runner import SuiteRunner

LAB = "lab1_attention"
SOURCE = b'''
import time

def double(x):
    return 2 * x

def add(x, y):
    return x + y

def hang():
    while True:
        time.sleep(0.01)
'''


@pytest.fixture(scope="module")
def scratch():
    with make_scratch({f"{LAB}.py": SOURCE}) as folder:
        yield folder


@pytest.fixture(scope="module")
def runner(rubric):
    with SuiteRunner(rubric=rubric) as r:
        yield r


def _call(target, *args):
    return {"op": "call", "target": target, "args": list(args), "kwargs": {}, "seed": 0}


def _plan(*calls: tuple[str, dict]) -> CallPlan:
    """A plan for LAB: (test, request) in order; the tests' order is their first call's."""
    tests = list(dict.fromkeys(test for test, _ in calls))
    return CallPlan.from_recording([(LAB, test, wire.encode(req)) for test, req in calls], tests)


def _report(result) -> dict:
    """A result as a dict without its timings (they differ between any two runs)."""
    data = result.to_dict()
    data.pop("execution_time", None)
    for lab in data.get("labs", []):
        for test in lab.get("tests", []):
            test.pop("duration_s", None)
    return data


@pytest.mark.parametrize("name", [
    "solutions", "ok_einsum", "ok_lab2_standalone", "bug_softmax_dim", "bug_mask_inverted",
    "bug_norm_first_ignored", "bug_dropout_in_eval", "bug_split_no_transpose",
    "bug_max_len_unchecked", "broken_import", "missing_lab3",
])
def test_send_ahead_grades_like_one_call_at_a_time(name, rubric, zygote, runner, tmp_path):
    folder = paths.SOLUTIONS if name == "solutions" else make_submission(name, tmp_path / name)
    ahead = grade_submission(folder, rubric=rubric, zygote=zygote, runner=runner, name=name)
    one_by_one = grade_submission(folder, rubric=rubric, zygote=zygote, runner=runner,
                                  name=name, send_ahead=False)
    assert _report(ahead) == _report(one_by_one)


def test_the_plan_is_every_request_of_the_solutions_in_order(rubric, zygote, runner):
    labs = list(rubric.labs)
    plan = plan_for(rubric=rubric, labs=labs, visibility=("public", "hidden"),
                    zygote=zygote, runner=runner)
    assert plan is not None and sorted(plan.calls) == sorted(labs)
    assert plan is plan_for(rubric=rubric, labs=labs, visibility=("public", "hidden"),
                            zygote=zygote, runner=runner)       # recorded once per process
    for lab, calls in plan.calls.items():
        assert calls[0].test == "" and b'"probe"' in calls[0].frame     # the import probe
        positions = [plan.position(c.test) for c in calls]
        assert positions == sorted(positions) and None not in positions
        assert all(f"test_{lab}.py::" in c.test for c in calls[1:])
    # every test of the rubric ran while recording (parametrized tests once per case)
    names = {t.split("::")[-1].split("[")[0] for t in plan.order}
    assert names == {t for spec in rubric.labs.values() for t in spec.tests}


def test_planned_replies_answer_the_tests_that_asked(zygote, scratch):
    plan = _plan(("t1", _call("double", 2)), ("t1", _call("add", 1, 2)), ("t2", _call("double", 5)))
    session = Session(zygote=zygote, submission_dir=scratch, forbidden={}, plan=plan)
    lab = StudentLab(session, LAB)
    try:
        session.start_test(10, test="t1")
        assert lab.call("double", 2) == 4 and lab.call("add", 1, 2) == 3
        worker = session.workers[LAB]
        session.start_test(10, test="t2")
        assert lab.call("double", 5) == 10
        assert session.workers[LAB] is worker and worker.pending == 0 and not session.streams
    finally:
        session.close()


def test_a_test_that_stops_early_has_its_planned_replies_dropped(zygote, scratch):
    plan = _plan(("t1", _call("double", 2)), ("t1", _call("add", 1, 2)), ("t2", _call("double", 7)))
    session = Session(zygote=zygote, submission_dir=scratch, forbidden={}, plan=plan)
    lab = StudentLab(session, LAB)
    try:
        session.start_test(10, test="t1")
        assert lab.call("double", 2) == 4          # and t1 stops here (a failed check)
        worker = session.workers[LAB]
        session.start_test(10, test="t2")          # add(1, 2)'s reply is read and dropped
        assert lab.call("double", 7) == 14
        assert session.workers[LAB] is worker and worker.pending == 0
    finally:
        session.close()


def test_a_request_other_than_planned_goes_on_one_call_at_a_time(zygote, scratch):
    plan = _plan(("t1", _call("double", 2)), ("t1", _call("double", 3)), ("t2", _call("double", 4)))
    session = Session(zygote=zygote, submission_dir=scratch, forbidden={}, plan=plan)
    lab = StudentLab(session, LAB)
    try:
        session.start_test(10, test="t1")
        assert lab.call("double", 2) == 4
        planned = session.workers[LAB]
        assert lab.call("double", 30) == 60        # not double(3): the plan is void
        assert not planned.alive and session.workers[LAB] is not planned
        assert LAB not in session.streams
        session.start_test(10, test="t2")
        assert lab.call("double", 4) == 8          # one call at a time from here on
        assert session.workers[LAB].pending == 0
    finally:
        session.close()


def test_a_planned_call_that_hangs_is_the_asking_tests_timeout(zygote, scratch):
    plan = _plan(("t1", _call("hang")), ("t2", _call("double", 1)))
    session = Session(zygote=zygote, submission_dir=scratch, forbidden={}, plan=plan)
    lab = StudentLab(session, LAB)
    try:
        session.start_test(1.5, test="t1")
        started = time.monotonic()
        with pytest.raises(StudentTimeout):
            lab.call("hang")
        assert 1.0 < time.monotonic() - started < 5.0
        session.start_test(10, test="t2")
        assert lab.call("double", 1) == 2          # a fresh worker, one call at a time
    finally:
        session.close()


def test_a_hang_in_a_dropped_planned_call_ends_that_worker_only(zygote, scratch):
    plan = _plan(("t1", _call("double", 1)), ("t1", _call("hang")), ("t2", _call("double", 2)))
    session = Session(zygote=zygote, submission_dir=scratch, forbidden={}, plan=plan)
    lab = StudentLab(session, LAB)
    try:
        session.start_test(1.0, test="t1")
        assert lab.call("double", 1) == 2          # t1 stops before it asks for hang()
        worker = session.workers[LAB]
        started = time.monotonic()
        session.start_test(10, test="t2")          # waits out t1's limit for hang(), then kills
        assert time.monotonic() - started < 5.0 and not worker.alive
        assert lab.call("double", 2) == 4
    finally:
        session.close()
