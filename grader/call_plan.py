"""Call plans: each test's first call, sent to its worker as the test starts.

A test asks its lab's worker for one call at a time and waits for each reply: the grader
and the worker take turns, and on this kind of machine every turn (a sleep, a wake-up, cold
caches after it) costs more than the small calls themselves. Yet a test's first call barely
depends on the submission: the suites draw their inputs from seeded generators. So the
grader grades the course's reference solutions once per suite runner, recording each
test's first request and how many calls it made (``record``); for every later submission,
``Session.start_test`` sends that request to the lab's worker as the test starts, and the
worker computes it while pytest sets the test up and the test builds its inputs and
references. Most tests make one call: as soon as such a test's call is answered, the first
requests of the tests after it (same lab, up to and including the next test that makes
more than one call) go out, so the worker works through them while the grader checks. A
test's first call takes the reply (already there, or on its way) if its request is
byte-for-byte the planned one.

Only a test's first request is ever planned: it cannot carry anything the test got back
from student code, so what is sent ahead holds inputs only, never a reference solution's
output (a test that passes an output back, like ``merge_heads(split_heads(x))``, does so in
a later call, which goes as asked). The suites must not carry values from one test to the
next (docs/internals.md), so no first request depends on another test's replies either.

A first request that differs from the plan, or a call the plan did not count (a one-call
test that made a second call while the next test's call was already out), voids what was
sent: that worker is killed and the call goes to a fresh one. A planned call the test never
made is read and dropped before the next test starts, within the finished test's limit.
Deadlines are unchanged: a test's calls answer within its limit, counted from its start.
The plan depends only on the suites, the rubric and the reference solutions, so a
submission grades the same way every time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grader import paths


@dataclass(frozen=True)
class PlannedCall:
    lab: str        # the lab whose worker the call goes to
    frame: bytes    # the request, as the wire encodes it


@dataclass
class CallPlan:
    """Each test's first call, how many calls it made, and the test run after it."""
    first: dict[str, PlannedCall] = field(default_factory=dict)    # test node id -> call
    calls: dict[str, int] = field(default_factory=dict)            # test node id -> count
    following: dict[str, str] = field(default_factory=dict)        # test -> the next test


def plan_for(*, runner, labs: list[str], zygote) -> CallPlan | None:
    """The plan for ``runner``'s suites and these labs, recorded once per runner; None
    without one.

    Recording grades the reference solutions (in the sandbox, like any submission, one call
    at a time) through ``runner``. No solutions, or a recording that fails: no plan, and
    grading goes one call at a time. A runner collects its suites once, so its plans stay
    right for as long as it runs (a batch's grading process keeps one).
    """
    key = tuple(labs)
    if key not in runner.plans:
        runner.plans[key] = (record(rubric=runner.rubric, labs=labs,
                                    visibility=runner.visibility, zygote=zygote, runner=runner)
                             if paths.SOLUTIONS.is_dir() else None)
    return runner.plans[key]


def record(*, rubric, labs: list[str], visibility: tuple[str, ...], zygote,
           runner) -> CallPlan | None:
    """Grade the reference solutions one call at a time, keeping each test's first request,
    its number of calls and the test after it (``Session(recording=...)``)."""
    from grader.grading import grade_with_session

    plan = CallPlan()
    try:
        grade_with_session(paths.SOLUTIONS, rubric=rubric, labs=labs, visibility=visibility,
                           zygote=zygote, runner=runner, plan=None, recording=plan)
    except Exception:  # noqa: BLE001 - without a plan, grading only goes slower
        return None
    return plan
