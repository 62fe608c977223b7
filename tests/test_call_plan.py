"""Calls sent ahead (grader/engine/call_plan.py): the same grades as one call at a time, only
inputs ever sent ahead, and the paths where a test does not follow the plan (another
request, no call, a hang)."""

from __future__ import annotations

import contextlib
import time

import pytest

from helpers import labs_changed, make_submission
from grader import paths
from grader.course import Course
from grader.engine.call_plan import CallPlan, PlannedCall
from grader.engine.student import Session, StudentLab, StudentTimeout
from grader.grading import Grader
from grader.sandbox import make_scratch, wire

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
def ahead(rubric, zygote):
    """A Grader that sends calls ahead (its plan recorded once, as a batch's)."""
    with Grader(Course(paths.KIT, rubric), zygote=zygote, send_ahead=True) as grader:
        yield grader


def _call(target, *args):
    return {"op": "call", "target": target, "args": list(args), "kwargs": {}, "seed": 0}


def _plan(**first: dict) -> CallPlan:
    """A plan for LAB: test name -> its first request."""
    return CallPlan(first={test: PlannedCall(LAB, wire.encode(req))
                           for test, req in first.items()})


@contextlib.contextmanager
def _session(zygote, scratch, plan: CallPlan):
    """A session on the scratch lab with ``plan``, and its ``student`` proxy."""
    session = Session(zygote=zygote, submission_dir=scratch, forbidden={}, plan=plan)
    try:
        yield session, StudentLab(session, LAB)
    finally:
        session.close()


@pytest.mark.parametrize("name", [
    "solutions", "ok_einsum", "ok_lab2_standalone", "bug_softmax_dim", "bug_mask_inverted",
    "bug_norm_first_ignored", "bug_dropout_in_eval", "bug_split_no_transpose",
    "bug_max_len_unchecked", "broken_import", "missing_lab3",
])
def test_send_ahead_grades_like_one_call_at_a_time(name, ahead, graded, rubric, tmp_path):
    """A fixture on the labs it changes (the others are the reference's files), the
    solutions whole; one call at a time is the session's shared grading (``graded``)."""
    labs = None if name == "solutions" else labs_changed(name, rubric)
    folder = (paths.KIT / "solutions") if name == "solutions" else make_submission(name, tmp_path / name)
    sent_ahead = ahead.grade(folder, labs=labs, name=name)
    assert ahead.call_plan(labs) is not None
    one_by_one, _ = graded(name, labs)
    assert sent_ahead.to_dict_without_timings() == one_by_one.to_dict_without_timings()


def test_the_plan_is_each_tests_first_request_and_inputs_only(rubric, ahead):
    plan = ahead.call_plan()
    assert plan is not None
    assert plan is ahead.call_plan(list(rubric.labs))  # recorded once
    # every test of the rubric has its first call planned (parametrized tests per case),
    # but a resource test: its calls are measured, each in a fresh worker of its own (lab
    # 8's training tests, budget cpu_s, train there too, then make one planned call: the
    # probe forward the diagnosis uses; lab 5's generate work test checks the values on a
    # short plain call before it measures); a graded run's public tests draw inputs of
    # each submission's own (#44), so they are never planned
    names = {t.split("::")[-1].split("[")[0] for t in plan.first}
    checked_first = {"test_generate_work_per_new_token"}
    assert names == {name for spec in rubric.labs.values()
                     for name, t in spec.tests.items() if t.visibility == "hidden"
                     and (t.budget is None or t.budget.cpu_s is not None
                          or name in checked_first)}
    assert any(t.budget for spec in rubric.labs.values() for t in spec.tests.values())
    for test, call in plan.first.items():
        assert f"test_{call.lab}.py::" in test and b'"probe"' not in call.frame
        assert plan.calls[test] >= 1
    assert len(plan.following) == len(plan.calls) - 1   # the tests in one chain, in order
    # merge_heads(split_heads(x)) passes the student's output back: only split_heads, the
    # first call, is planned, so the reference's split never reaches a worker early.
    roundtrip = next(c for t, c in plan.first.items()
                     if t.endswith("test_split_and_merge_keep_float64"))
    assert b'"split_heads"' in roundtrip.frame and b'"merge_heads"' not in roundtrip.frame


def test_a_planned_reply_answers_the_test_that_asked(zygote, scratch):
    plan = _plan(t1=_call("double", 2), t2=_call("add", 1, 2))
    with _session(zygote, scratch, plan) as (session, lab):
        session.start_test(10, test="t1")
        worker = session.workers[LAB]
        assert worker.pending == 1                   # sent as the test started
        assert lab.call("double", 2) == 4 and worker.pending == 0
        assert lab.call("double", 3) == 6            # later calls go as asked
        session.start_test(10, test="t2")
        assert lab.call("add", 1, 2) == 3
        assert session.workers[LAB] is worker and worker.pending == 0


def test_after_a_one_call_test_the_next_tests_call_goes_at_once(zygote, scratch):
    plan = _plan(t1=_call("double", 2), t2=_call("double", 3), t3=_call("double", 4))
    plan.calls = {"t1": 1, "t2": 1, "t3": 2}
    plan.following = {"t1": "t2", "t2": "t3"}
    with _session(zygote, scratch, plan) as (session, lab):
        session.start_test(10, test="t1")
        assert lab.call("double", 2) == 4
        worker = session.workers[LAB]
        # t1 made its one call: t2's and t3's first calls go at once (t3 makes two calls,
        # so the chain stops there: its second call goes as asked)
        assert worker.pending == 2 and [a.test for a in session.ahead] == ["t2", "t3"]
        session.start_test(10, test="t2")
        assert lab.call("double", 3) == 6
        assert worker.pending == 1 and [a.test for a in session.ahead] == ["t3"]
        # t2 was planned as a one-call test; a second call voids t3's, which is out
        assert lab.call("add", 2, 2) == 4
        assert not worker.alive and session.ahead == []
        session.start_test(10, test="t3")                          # sent again, fresh worker
        assert session.workers[LAB].pending == 1
        assert lab.call("double", 4) == 8 and lab.call("double", 5) == 10
        assert session.ahead == []


def test_a_planned_call_the_test_never_makes_is_dropped(zygote, scratch):
    plan = _plan(t1=_call("double", 2), t2=_call("double", 7))
    with _session(zygote, scratch, plan) as (session, lab):
        session.start_test(10, test="t1")            # and t1 ends without a call
        worker = session.workers[LAB]
        session.start_test(10, test="t2")            # double(2)'s reply is read and dropped
        assert lab.call("double", 7) == 14
        assert session.workers[LAB] is worker and worker.pending == 0


def test_a_first_request_other_than_planned_goes_to_a_fresh_worker(zygote, scratch):
    plan = _plan(t1=_call("double", 2), t2=_call("double", 4))
    with _session(zygote, scratch, plan) as (session, lab):
        session.start_test(10, test="t1")
        planned = session.workers[LAB]
        assert lab.call("double", 30) == 60          # not double(2): the plan is void
        assert not planned.alive and session.workers[LAB] is not planned
        session.start_test(10, test="t2")
        assert lab.call("double", 4) == 8


def test_a_planned_call_that_hangs_is_the_asking_tests_timeout(zygote, scratch):
    plan = _plan(t1=_call("hang"), t2=_call("double", 1))
    with _session(zygote, scratch, plan) as (session, lab):
        session.start_test(1.5, test="t1")
        started = time.monotonic()
        with pytest.raises(StudentTimeout):
            lab.call("hang")
        assert 1.0 < time.monotonic() - started < 5.0
        session.start_test(10, test="t2")
        assert lab.call("double", 1) == 2            # a fresh worker


def test_a_hang_in_a_planned_call_nobody_made_ends_that_worker_only(zygote, scratch):
    plan = _plan(t1=_call("hang"), t2=_call("double", 2))
    with _session(zygote, scratch, plan) as (session, lab):
        session.start_test(1.0, test="t1")           # t1 ends without asking for hang()
        worker = session.workers[LAB]
        started = time.monotonic()
        session.start_test(10, test="t2")            # waits out t1's limit, then kills
        assert 0.9 < time.monotonic() - started < 5.0 and not worker.alive
        assert lab.call("double", 2) == 4
