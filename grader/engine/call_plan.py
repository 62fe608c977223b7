"""Call plans: each test's first call, sent to its worker as the test starts.

A test asks its lab's worker for one call at a time and waits for each reply: the grader
and the worker take turns, and on this kind of machine every turn (a sleep, a wake-up, cold
caches after it) costs more than the small calls themselves. Yet a test's first call barely
depends on the submission: the suites draw their inputs from seeded generators. So the
grader grades the course's reference solutions once per Grader (``grading.Grader``),
recording each test's first request and how many calls it made; for every later submission,
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

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from grader.sandbox import WorkerDied, WorkerTimeout


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


class PlanRecorder:
    """Fills a CallPlan while the reference solutions are graded one call at a time."""

    def __init__(self, plan: CallPlan):
        self.plan = plan
        self.test = ""
        self.plannable = True

    def start_test(self, test: str, plannable: bool = True) -> None:
        """``test`` starts; ``plannable``: False for a test whose inputs differ per
        submission (a graded run's public tests): its first call is not recorded, so
        nothing is sent ahead for it (it would never match)."""
        if self.test:
            self.plan.following[self.test] = test
        self.plan.calls[test] = 0
        self.test, self.plannable = test, plannable

    def sent(self, lab: str, frame: bytes) -> None:
        """The current test sent ``frame`` to ``lab``'s worker."""
        if self.test:
            if self.plannable:
                self.plan.first.setdefault(self.test, PlannedCall(lab, frame))
            self.plan.calls[self.test] += 1


MAX_AHEAD = 8   # planned calls out to a worker at once


@dataclass
class Ahead:
    """A test's planned first call, sent to ``worker`` before the test asked for it."""
    test: str
    call: PlannedCall
    worker: Any             # grader.sandbox.Worker


class Prefetcher:
    """Sends planned first calls to the workers ahead of their tests (see the module doc).

    ``worker_for(lab)``: the lab's live worker, or a new one (the Session's); it raises
    when none can be had, and the test's own call then meets the same failure.
    """

    def __init__(self, plan: CallPlan, worker_for: Callable[[str], Any]):
        self.plan, self.worker_for = plan, worker_for
        self.ahead: list[Ahead] = []        # in the order their worker answers them

    def drop_unasked(self, test: str, time_limit_s: float) -> None:
        """Before ``test``: read and drop the replies of planned calls that the tests
        before it never made, within ``time_limit_s`` (else their worker is killed)."""
        deadline = time.monotonic() + time_limit_s
        while self.ahead and self.ahead[0].test != test:
            stale = self.ahead.pop(0)
            try:
                stale.worker.receive(timeout_s=max(0.0, deadline - time.monotonic()))
            except (WorkerTimeout, WorkerDied):
                self.ahead.clear()      # killed: what was sent to it is lost

    def start_test(self, test: str) -> None:
        """``test`` starts: send its first call now, unless calls are already out."""
        if self.ahead and not self.ahead[0].worker.alive:
            self.ahead.clear()          # sent to a worker that has ended since: send again
        planned = self.plan.first.get(test) if test else None
        if planned is not None and not self.ahead:
            self._send(test, planned)

    def take(self, test: str, lab: str, frame: bytes):
        """The worker already computing this call, if it is ``test``'s planned one; None
        otherwise. A call to a lab whose worker is busy with other planned calls voids
        them: that worker is killed and this call goes to a fresh one."""
        ahead = self.ahead[0] if self.ahead else None
        if ahead is None or ahead.call.lab != lab:
            return None
        if ahead.test == test and ahead.call.frame == frame:
            self.ahead.pop(0)
            return ahead.worker
        ahead.worker.kill()
        self.ahead.clear()
        return None

    def answered(self, test: str, lab: str, made: int) -> None:
        """``test``'s call number ``made`` to ``lab`` was answered: once it has made all its
        planned calls, send the next tests' first calls, up to and including the next test
        that makes more than one (its later calls go as asked, so nothing may be queued
        behind them)."""
        if made != self.plan.calls.get(test):
            return
        last = self.ahead[-1].test if self.ahead else test
        if self.ahead and self.plan.calls.get(last) != 1:
            return
        while len(self.ahead) < MAX_AHEAD:
            nxt = self.plan.following.get(last)
            planned = self.plan.first.get(nxt) if nxt else None
            if planned is None or planned.lab != lab or not self._send(nxt, planned):
                return
            if self.plan.calls.get(nxt) != 1:
                return
            last = nxt

    def _send(self, test: str, planned: PlannedCall) -> bool:
        try:
            worker = self.worker_for(planned.lab)
            worker.send_ahead(planned.frame, count=1)
        except Exception:  # noqa: BLE001 - the test's own call meets the same failure
            return False
        self.ahead.append(Ahead(test, planned, worker))
        return True
