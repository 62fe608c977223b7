"""Call plans: the calls the suites make of a correct submission, sent to workers ahead.

A test asks its lab's worker for one call at a time and waits for each reply: the grader
and the worker take turns, and on this kind of machine every turn (a sleep, a wake-up, cold
caches after it) cost more than the small calls themselves. Yet the calls barely depend on
the submission: the suites draw their inputs from seeded generators and build a fresh
module for every call. So the grader grades the course's reference solutions once per
process, recording every request each test made (``record``), and for every later
submission hands each lab's worker that whole list when it starts
(``Session(plan=...)``, ``Worker.send_ahead``). The worker works through it while pytest
runs the tests; a test's call whose request is the planned one takes the reply already
there. What a test asks is still checked: a request that differs from the plan (a test
that took another path) voids what was sent ahead, kills that worker, and the lab goes on
one call at a time in a fresh one. Planned calls of a test that stopped early (a failed
check) still run, in order; their replies are read and dropped before the next test
starts, within the finished test's time limit.

Deadlines are unchanged: a test's calls must answer within its own limit, counted from its
start, and a worker that overruns is killed as before. For code whose calls do not depend
on one another's side effects, the outcome is the same as one call at a time; code that
keeps state between calls may see the state of planned calls of a test that failed early.
The plan depends only on the suites, the rubric and the reference solutions, so a
submission grades the same way every time (a rerun of a batch gives the same gradebook).
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path

from grader import paths


@dataclass(frozen=True)
class PlannedCall:
    test: str       # node id of the test that makes the call; "" for the lab's import probe
    frame: bytes    # the request, as the wire encodes it


@dataclass
class CallPlan:
    """Per lab, the planned calls in the order the grader makes them."""
    calls: dict[str, list[PlannedCall]] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)   # test node id -> position

    def position(self, test: str) -> int | None:
        """Where ``test`` runs among the planned tests (-1 for the probes; None: unknown)."""
        return -1 if test == "" else self.order.get(test)

    @classmethod
    def from_recording(cls, recording: list[tuple[str, str, bytes]],
                       tests: list[str]) -> "CallPlan":
        """``recording``: (lab, test node id, frame) per request; ``tests``: the run order."""
        plan = cls(order={test: i for i, test in enumerate(tests)})
        for lab, test, frame in recording:
            plan.calls.setdefault(lab, []).append(PlannedCall(test, frame))
        return plan


def _digest_files(h, root: Path, pattern: str) -> None:
    for path in sorted(root.rglob(pattern)):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")


def solutions_digest() -> str:
    """sha256 of the reference solutions the plans are recorded with ("" if there are none)."""
    if not paths.SOLUTIONS.is_dir():
        return ""
    h = hashlib.sha256()
    _digest_files(h, paths.SOLUTIONS, "*.py")
    return h.hexdigest()


_PLANS: dict[tuple, CallPlan | None] = {}
_LOCK = threading.Lock()


def plan_for(*, rubric, labs: list[str], visibility: tuple[str, ...], zygote,
             runner) -> CallPlan | None:
    """The plan for these labs and suites, recorded once per process; None without one.

    Recording grades the reference solutions (in the sandbox, like any submission, one call
    at a time) through ``runner``. No solutions, or a recording that fails: no plan, and
    grading goes one call at a time.
    """
    from grader.batch import course_digests

    if not paths.SOLUTIONS.is_dir():
        return None
    try:
        key = (tuple(visibility), tuple(labs), tuple(sorted(course_digests(rubric).items())),
               solutions_digest())
    except Exception:  # noqa: BLE001 - e.g. a rubric built in memory, with no file
        return None
    with _LOCK:
        if key not in _PLANS:
            _PLANS[key] = record(rubric=rubric, labs=labs, visibility=visibility,
                                 zygote=zygote, runner=runner)
        return _PLANS[key]


def record(*, rubric, labs: list[str], visibility: tuple[str, ...], zygote,
           runner) -> CallPlan | None:
    """Grade the reference solutions one call at a time and keep every request made."""
    from grader.grading import grade_with_session

    recording: list[tuple[str, str, bytes]] = []
    tests: list[str] = []
    try:
        grade_with_session(paths.SOLUTIONS, rubric=rubric, labs=labs, visibility=visibility,
                           zygote=zygote, runner=runner, plan=None,
                           recording=recording, tests=tests)
    except Exception:  # noqa: BLE001 - without a plan, grading only goes slower
        return None
    return CallPlan.from_recording(recording, tests)
