"""The ``student`` proxy: how the suites reach student code without ever running it here.

Every call becomes a request to an isolated worker (``grader.sandbox``) serving one lab of
one submission; only plain values come back. A test's wall-clock budget (from the rubric)
covers all its calls: the worker is killed when it runs out, and a fresh one serves the
next test. See docs/internals.md section 3 for the API the suites use.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import os
import time
from dataclasses import dataclass, field, replace

import torch

from grader.engine import relay_cost
from grader.engine.call_plan import CallPlan, PlanRecorder, Prefetcher
from grader.engine.lab_clock import LabClock
from grader.sandbox import (SandboxError, Worker, WorkerDied, WorkerTimeout, Zygote, jail,
                            memcg, protocol, usage, wire)
from grader.sandbox.channel import LOAD_STRETCH_MAX, Answer, EndWorker
from grader.sandbox.host import make_scratch
from grader.sandbox.usage import Measured


def _exception_names() -> frozenset[str]:
    """The exception type names a hidden test may show: Python's built-in exceptions and
    torch's own. Any other name is the student's choice, and so a channel out of the test."""
    names = {n for n, v in vars(builtins).items()
             if isinstance(v, type) and issubclass(v, BaseException)}
    for module in (torch, torch.linalg, torch.cuda):
        names |= {n for n, v in vars(module).items()
                  if isinstance(v, type) and issubclass(v, BaseException)}
    return frozenset(names)


SHOWN_EXCEPTIONS = _exception_names()
TEXT_CAP = 2000             # characters of any one piece of text from a worker


class StudentError(Exception):
    """Student code failed: raised, crashed, hung or could not be imported.

    ``kind`` is one of: exception, not_implemented, forbidden, import, timeout, crash.
    """

    def __init__(self, *, kind: str, type_name: str = "", mro=(), message: str = "",
                 where: str = "", lab: str = "", stdout: str = ""):
        self.kind, self.type_name, self.mro = kind, type_name, tuple(mro)
        self.message, self.where, self.lab, self.stdout = message, where, lab, stdout
        self.note = ""          # the grader's own words on where it came from (see Session)
        super().__init__(self.describe(hidden=False))

    def describe(self, *, hidden: bool, scrub=None) -> str:
        """A teaching sentence. For a hidden test nothing the student's code chose: the
        kind of failure only, an exception's type by a fixed list of built-in and torch
        names ("an exception" for any other), no message, no place, no function name.
        ``scrub``: applied to every piece of text the student's code chose (type name,
        message, place) before it is shown (a graded run's public tests)."""
        if hidden:
            return self._describe_hidden()
        text = self._describe_public(scrub or (lambda s: s))
        return f"{text}. {self.note}" if self.note else text

    def _describe_public(self, scrub) -> str:
        where, message, type_name = scrub(self.where), scrub(self.message), scrub(self.type_name)
        at = f" at {where}" if where else ""
        if self.kind == "not_implemented":
            return f"not implemented yet ({message or type_name}{at})"
        if self.kind == "timeout":
            return self.message                   # the grader's own words
        if self.kind == "crash":
            return f"your code crashed the worker process{at}: {message}"
        if self.kind == "forbidden":
            return f"forbidden API: {message}"
        if self.kind == "import":
            return f"{self.lab}.py could not be imported: {type_name}{at}: {message}"
        return f"your code raised {type_name}{at}: {message}"

    def _describe_hidden(self) -> str:
        if self.kind == "not_implemented":
            return "not implemented yet"
        if self.kind == "timeout":
            return self.message                   # the grader's own words
        if self.kind == "crash":
            return ("your code crashed the worker process (it exited or was killed before "
                    "answering, or wrote to the grader's channel)")
        if self.kind == "forbidden":
            return "your code used an API this lab may not use (see the lab's rules)"
        if self.kind == "import":
            return f"{self.lab}.py could not be imported"
        name = self.type_name if self.type_name in SHOWN_EXCEPTIONS else "an exception"
        return f"your code raised {name}"


class MissingRaise(AssertionError):
    """``student.raises`` saw no exception of the type due. Its words hold nothing of the
    test's inputs, so hidden tests show them too (``hidden``: without the place)."""

    def __init__(self, public: str, hidden: str | None = None):
        super().__init__(public)
        self.public, self.hidden = public, hidden if hidden is not None else public


class NotMeasuredHere(Exception):
    """A resource test on a machine whose kernel shows the grader no running process's
    figures (the portable backend on macOS or Windows): reported as measured when the work
    is graded (``TestStatus.DEFERRED``), never passed or failed here."""

    def __init__(self, what: str):
        super().__init__(
            f"{what} is measured when your work is graded: this machine's system shows the "
            "grader no figures of a running process (the portable backend), so this test is "
            "neither passed nor failed here, and no points are shown as lost")


class StudentTimeout(StudentError):
    pass


def _text(value, cap: int = TEXT_CAP) -> str:
    """A worker-sent value as capped text (a worker may send anything in any field)."""
    return (value if isinstance(value, str) else "")[:cap]


def _error_from_reply(err: dict, lab: str, stdout: str) -> StudentError:
    mro = err.get("mro")
    mro = [_text(m, 200) for m in mro[:64]] if isinstance(mro, list) else []
    mro = mro or [_text(err.get("type"), 200) or "Exception"]
    if "ForbiddenAPIError" in mro:
        kind = "forbidden"
    elif err.get("import_failed"):
        kind = "import"
    elif "NotImplementedError" in mro:
        kind = "not_implemented"
    else:
        kind = "exception"
    return StudentError(kind=kind, type_name=_text(err.get("type"), 200) or "Exception",
                        mro=mro, message=_text(err.get("message")),
                        where=_text(err.get("where"), 300), lab=lab, stdout=stdout)


MAX_RECORDED_CALLS = 200      # per test; a test making more keeps the first ones
MAX_CALLBACK_ELEMENTS = 1 << 22   # numbers in one call into another lab (4 Mi: ~32 MB)
# A number argument of a call into another lab sizes work (a length, a position, a chunk
# count): bounded like the tensors' sizes.
MAX_CALLBACK_SCALAR = MAX_CALLBACK_ELEMENTS
MAX_CALLBACK_REPLY_BYTES = 64 << 20   # a reference worker's reply: value and gradients
# Bytes of tensors relayed between a test's workers and the reference workers, both ways
# (a test's calls into other labs), for each second of the test's time limit: what the
# grading process may copy for one test (its CPU time: ~0.8 s a GB relayed, measured). An
# honest lab 8 training through its own lab 1 relays ~13.6 MB a step (7.1 GB in one
# training here; the reference loop's 3,000 steps at most would be 41 GB, within the 40
# GiB of its 160 s test); lab 2's 10 s tests may relay 2.5 GiB. See docs/security.md.
# The relay holds at most one request and one reply at a time.
MAX_RELAYED_BYTES_PER_SECOND = 256 << 20


@dataclass
class RecordedCall:
    """One student call of the current test: the request, and its value or its error."""
    lab: str
    req: dict
    value: object = None
    error: StudentError | None = None
    used: Measured | None = None        # what the call used (student.measure only)


@dataclass
class Session:
    """The workers for one submission (at most one live worker per lab) and the calls of
    the test being run.

    ``plan`` (grader.engine.call_plan): send each test's first call ahead of it (a
    ``Prefetcher``). ``recording``: a CallPlan to fill with each test's first request, call
    count and successor (a ``PlanRecorder``; how a plan is made).
    ``importable``: lab under test -> earlier lab -> the names it may import of it
    (``Rubric.importable``). ``reference_dir``: a folder of the course's reference
    solutions, readable by workers: calls into those names are then answered by the
    reference in a reference worker per (calling lab, other lab) (protocol "Callbacks"), so
    a lab's points depend on its own code only; None: the submission's own files answer.
    """
    zygote: Zygote
    submission_dir: str
    forbidden: dict[str, tuple[str, ...]]          # lab -> dotted names it may not use
    importable: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    reference_dir: str | None = None
    # What answers those imports when the lab is graded (the rubric's ``lab_imports``):
    # without ``reference_dir`` but "reference", a failure from an imported lab says so.
    imports_when_graded: str = "reference"
    plan: CallPlan | None = None
    recording: CallPlan | None = None
    deadline: float = float("inf")                  # monotonic time the current test ends
    # Seconds the test's deadline may still move for time its workers waited for a CPU
    # (the machine's load, never the student's): a test's later calls keep what load took
    # from its earlier ones, up to channel.LOAD_STRETCH_MAX times the test's limit.
    load_credit_s: float = 0.0
    time_limit_s: float = 10.0
    workers: dict[str, Worker] = field(default_factory=dict)
    last_stdout: str = ""
    # The current test's student calls (request and decoded reply, or the StudentError),
    # kept in this trusted process for the mistake diagnosis (grader.diagnose) of a
    # failed test; reset by start_test.
    calls: list[RecordedCall] = field(default_factory=list)
    test: str = ""                                  # node id of the current test
    lab: str = ""                                   # the lab of the current test
    made: int = 0                                   # calls the current test has made
    fault: SandboxError | None = None               # the sandbox failed us (not the student)
    # Train requests answered for this submission (lab, request frame) -> (value, Measured)
    # or the StudentError: a lab's outcome tests share one training (``train``).
    trained: dict = field(default_factory=dict)
    # The reference workers answering calls into other labs: (calling lab, other lab) ->
    # Worker; the CPU time their answers took since ``reference_cpu_ns`` was last reset (a
    # training's is the student's; ``_reference_answer``); ``measuring``: a measured call's own reference workers
    # (fresh ones, ended with it: what they use in its window is the call's, see
    # ``_MeasuredReferences``), or None.
    reference_workers: dict = field(default_factory=dict)
    reference_cpu_ns: int = 0
    last_answer_cpu_ns: int = 0     # the CPU time of the last answer (``_answer``)
    measuring: "_MeasuredReferences | None" = None
    relayed_bytes: int = 0          # tensor bytes the current test's callbacks moved
    # Tensor bytes every callback sent and read (never reset: a measured call or a
    # training takes the difference), and what moving them costs a worker of each lab
    # (``relay_cost``: calibrated once, in a fresh worker, when first needed).
    moved: relay_cost.Moved = field(default_factory=relay_cost.Moved)
    framing_rates: dict = field(default_factory=dict)
    references: dict = field(default_factory=dict)  # lab -> scratch folder of its reference
    solutions: str | None = None                    # the course's solutions/ (the references)
    # Charged with the CPU time of each lab (each test, if it asks), the workers this
    # session spawns included (``engine.lab_clock``); None: nothing is timed.
    clock: LabClock | None = None

    def __post_init__(self):
        # Every large buffer of this process (a relayed request or reply, a worker's reply)
        # gets its own mapping, returned to the kernel when freed: its peak is what it held
        # at once, not what glibc's heap kept after a burst of replies (#25).
        jail.map_large_allocations()
        self.prefetch = Prefetcher(self.plan, self._worker) if self.plan is not None else None
        self.recorder = PlanRecorder(self.recording) if self.recording is not None else None

    @property
    def ahead(self) -> list:
        """Planned calls out to a worker, in the order it answers them."""
        return self.prefetch.ahead if self.prefetch is not None else []

    def start_test(self, time_limit_s: float, test: str = "", lab: str = "",
                   plannable: bool = True) -> None:
        """A test of ``lab`` (or a lab's import probe: no test) starts now. ``plannable``:
        its first request is the same for every submission (``engine.call_plan``); a graded
        run's public tests draw inputs of each submission's own, and are never planned."""
        if lab and self.clock is not None:
            # Before the previous lab's workers end: what they spent is that lab's.
            self.clock.switch(lab, test)
        if lab and self.lab and lab != self.lab:
            # The previous lab is done: its worker, and any thread or process it started,
            # ends now rather than running on beside the next labs' tests.
            done = self.workers.pop(self.lab, None)
            if done is not None:
                done.kill()
            self._end_reference_workers()
        if lab:
            self.lab = lab
        if self.recorder is not None and test:
            self.recorder.start_test(test, plannable=plannable)
        if self.prefetch is not None:
            # Within the finished test's limit; this test's own call may be out already.
            self.prefetch.drop_unasked(test, self.time_limit_s)
        self.test, self.made = test, 0
        # Whatever the previous test's calls left running (a daemon, a fork bomb, a
        # setsid'd grandchild) ends with that test: its worker is replaced.
        for worker in [*self.workers.values(), *self.reference_workers.values()]:
            if worker.alive and worker.has_children():
                worker.kill()
        self.time_limit_s = time_limit_s
        self.relayed_bytes = 0
        self.deadline = time.monotonic() + time_limit_s
        self.load_credit_s = LOAD_STRETCH_MAX * time_limit_s
        self.calls = []
        if self.prefetch is not None:
            self.prefetch.start_test(test)

    def request(self, lab: str, req: dict):
        """Send ``req`` to the lab's worker; the reply's value. Every call is recorded."""
        try:
            value = self._send(lab, req)
        except StudentError as exc:
            self._record(RecordedCall(lab, req, error=exc))
            raise
        self._record(RecordedCall(lab, req, value=value))
        return value

    def _record(self, call: "RecordedCall") -> None:
        if len(self.calls) < MAX_RECORDED_CALLS:
            self.calls.append(call)

    def _worker(self, lab: str) -> Worker:
        """The lab's live worker, or a new one."""
        worker = self.workers.get(lab)
        if worker is not None and worker.alive:
            return worker
        worker = self._spawn(lab)
        self.workers[lab] = worker
        return worker

    def _spawn(self, lab: str, *, reference: bool = False) -> Worker:
        """A new worker for ``lab`` (the caller keeps it, or kills it); ``reference``: one
        serving the course's reference file of the lab instead of the submission's (its
        own imports of earlier labs are the reference's too)."""
        importable = self.importable.get(lab) or {}
        by_reference = self._relays(lab)
        if reference:
            folder = self.reference_dir or self._reference_folder(lab)
        else:
            folder = self.submission_dir
        try:
            worker = self.zygote.spawn(submission=folder, lab=lab,
                                       forbidden=[] if reference
                                       else list(self.forbidden.get(lab, ())),
                                       importable=importable,
                                       answered_by="reference"
                                       if by_reference and not reference else "own")
        except SandboxError as exc:
            # Not the student's doing: the test in flight fails at once, and the Grader
            # turns the whole submission into a grader fault (``fault``), never a score.
            self.fault = self.fault or exc
            raise StudentError(kind="crash", message=f"the sandbox failed: {exc}",
                               lab=lab) from None
        if by_reference:
            worker.on_callback = functools.partial(self._answer, lab)
        self._watch(worker)
        return worker

    def _watch(self, worker: Worker) -> None:
        """The clock counts ``worker`` (and its keeper) until they are reaped."""
        if self.clock is not None:
            self.clock.watch(worker.pid, keeper=getattr(worker, "keeper", None))

    def _send(self, lab: str, req: dict):
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self._timeout(lab)
        frame = wire.encode(req)
        if self.recorder is not None:
            self.recorder.sent(lab, frame)
        worker = self.prefetch.take(self.test, lab, frame) if self.prefetch is not None else None
        sent = worker is not None
        worker = worker or self._worker(lab)
        self.made += 1
        with self._waiting(lab):
            if not sent:
                worker.send_ahead(frame, count=1)
            reply = worker.receive(timeout_s=remaining)
            self._credit_load(worker)
            if self.prefetch is not None:
                self.prefetch.answered(self.test, lab, self.made)
        return self._reply_value(worker, lab, reply)

    def _credit_load(self, worker: Worker) -> None:
        """The test's deadline moves by the time ``worker``'s last reply waited for a CPU."""
        extra = min(worker.load_delay_s, self.load_credit_s)
        self.deadline += extra
        self.load_credit_s -= extra

    @contextlib.contextmanager
    def _waiting(self, lab: str):
        """A worker's reply awaited: out of time is a timeout, a dead worker a crash."""
        try:
            yield
        except WorkerTimeout:
            raise self._timeout(lab) from None
        except WorkerDied as exc:
            raise StudentError(
                kind="crash", lab=lab,
                message="it exited or was killed before answering (os._exit, a signal, "
                        f"a segfault, or a resource limit: memory, CPU time, files) [{exc}]",
            ) from None

    def _reply_value(self, worker: Worker, lab: str, reply):
        """The value of a worker's reply, or the StudentError it stands for."""
        if not isinstance(reply, dict):
            worker.kill()
            raise StudentError(kind="crash", lab=lab, message="the worker sent a malformed reply")
        self.last_stdout = _text(reply.get("stdout"), 4000)
        used = reply.get("forbidden")
        error = reply.get("error")
        mro = error.get("mro") if isinstance(error, dict) else None
        if isinstance(used, list) and used and not (
                isinstance(mro, list) and "ForbiddenAPIError" in mro):
            # Reported even when student code caught the ForbiddenAPIError.
            names = ", ".join(sorted({str(u)[:200] for u in used}))
            raise StudentError(kind="forbidden", lab=lab, type_name="ForbiddenAPIError",
                               mro=("ForbiddenAPIError",), stdout=self.last_stdout,
                               message=f"{lab} may not use {names} (see the lab's rules)")
        if "error" in reply and isinstance(reply["error"], dict):
            error = _error_from_reply(reply["error"], lab, self.last_stdout)
            error.note = self._imported_lab_note(lab, error.where)
            raise error
        if "ok" not in reply:
            worker.kill()
            raise StudentError(kind="crash", lab=lab, message="the worker sent a malformed reply")
        return reply["ok"]

    def _imported_lab_note(self, lab: str, where: str) -> str:
        """Where the submission's own earlier lab answered ``lab``'s imports but will not
        when graded (a kit without the reference): that a failure raised in that lab's file
        (``where``, "lab1_attention.py:30 in ...") comes from it."""
        other = where.split(".py:", 1)[0] if ".py:" in where else ""
        if (self.reference_dir is not None or self.imports_when_graded != "reference"
                or other not in (self.importable.get(lab) or {})):
            return ""
        return (f"This comes from your own {other}.py, which {lab} imports: without the "
                f"course's reference (this check) your {other} answers those calls; when "
                f"{lab} is graded it gets the course's {other}, and your {other}.py is "
                "graded on its own")

    def measure(self, lab: str, req: dict, warmup: dict | None = None, *,
                reference: bool = False) -> tuple[object, Measured]:
        """``req`` (a call or grad request) in a fresh worker of its own, measured from the
        kernel's accounting (``grader.sandbox.usage``, ``grader.sandbox.memcg``): (the
        reply's value, what the call used above its inputs). ``warmup``: a request run
        first in the same worker, on other inputs (``StudentLab.measure`` draws them), so
        that a library's one-time cost (a lazy import, a first-call cache) is not the
        call's; what it leaves held is ``kept_bytes``. ``reference``: the course's
        reference answers instead, in a worker like the student's (its time is the test's
        too); not recorded. Never sent ahead; recorded like every call.

        The order is the guarantee: the worker imports the libraries, the lab and runs the
        warm-up before it holds anything of ``req``; the measurement (a fresh cgroup's
        peak, or the reset high-water mark, and the CPU time) starts before ``req`` is sent,
        so receiving and decoding its inputs is inside it whatever the lab's code patched in
        the worker, and the inputs' own bytes (the frame's payload, counted here) are taken
        off the peak."""
        if not usage.accounting_available():
            raise NotMeasuredHere("The memory and work of this call")
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self._timeout(lab)
        worker = setup = call = None
        try:
            worker = self._spawn(lab, reference=reference)
            # Calls into other labs go to reference workers of this measurement's own, and
            # what they use during the measured call is the call's (``_MeasuredReferences``).
            self.measuring = _MeasuredReferences()
            setup = memcg.group()
            if setup is not None:
                setup.add(worker.pid)       # what the import and the warm-up hold is read here
            self._exchange(worker, lab, protocol.prepare_request())    # libraries, mallopt
            held = self._memory_now(worker, setup)   # the lab not imported yet
            self._exchange(worker, lab, protocol.probe_request([]))     # import the lab
            imported = self._memory_now(worker, setup)
            if warmup is not None:
                self._exchange(worker, lab, warmup)
            warmed = self._memory_now(worker, setup)
            frame = wire.encode(req)
            inputs = wire.PREFIX.unpack_from(frame)[1]      # the bytes of its tensors
            if setup is not None:
                call = memcg.group()
            if call is not None:
                call.add(worker.pid)        # only what the worker faults in from here counts
            else:
                usage.reset_peak(worker.pid)
            self.measuring.start(call)
            before = usage.reading(worker.pid)
            moved = self.moved.copy()
            value = self._exchange(worker, lab, frame=frame)
            after = usage.reading(worker.pid)
            used = usage.measured(before, after, children_alive=worker.has_children())
            moved, own_cpu_s = self.moved.since(moved), used.cpu_s
            others = self.measuring.used()
            used = replace(used, cpu_s=used.cpu_s + others.cpu_s)
            if setup is not None and call is not None:
                # Read again now: pages the worker touched after the warm-up's reply and
                # before its move into ``call`` (a thread the warm-up left running) stay
                # charged to ``setup``; read only before, they counted nowhere.
                warmed = max(warmed, self._memory_now(worker, setup))
            # With a cgroup, the reference workers are in it (its peak is of the sum).
            call_peak = call.peak() if call is not None else used.peak_bytes + others.peak_bytes
            used = replace(used, peak_bytes=usage.charged(
                imported=imported - held, call_peak=call_peak, inputs=inputs),
                kept_bytes=max(0, warmed - imported), inputs_bytes=inputs)
        except StudentError as exc:
            if reference and exc.kind != "timeout":   # the grader's fault, never a score
                self.fault = self.fault or SandboxError(f"the reference {lab} failed: {exc}")
            else:
                self._record(RecordedCall(lab, req, error=exc))
            raise
        except OSError as exc:          # the worker's /proc went away: it is gone
            error = StudentError(kind="crash", lab=lab,
                                 message=f"the worker ended before it could be measured ({exc})")
            if reference:
                self.fault = self.fault or SandboxError(f"the reference {lab} failed: {exc}")
            else:
                self._record(RecordedCall(lab, req, error=error))
            raise error from None
        finally:
            if self.measuring is not None:
                self.measuring.end()
            self.measuring = None
            if worker is not None:
                worker.kill()
            for group in (setup, call):
                if group is not None:
                    group.remove()
        # Moving its calls' bytes is the relay's (``relay_cost``): the rate is calibrated, if
        # it is not yet, now that the measured worker and everything it started are gone.
        relay_s = self._framing_s(lab, moved, own_cpu_s)
        used = replace(used, cpu_s=used.cpu_s - relay_s, relay_s=relay_s)
        if not reference:
            self._record(RecordedCall(lab, req, value=value, used=used))
        return value, used

    @staticmethod
    def _memory_now(worker: Worker, group) -> int:
        """Bytes the worker holds now: charged to its cgroup, or resident (the fallback)."""
        return group.usage() if group is not None else usage.reading(worker.pid).resident

    def train(self, lab: str, req: dict) -> tuple[object, Measured]:
        """A train request (protocol "train"), answered once per submission: the first test
        that asks runs it in a fresh worker of its own, its CPU time read from the kernel's
        accounting (the lab's import included); later tests get
        the same reply, or the same error. Recorded in every test that asks."""
        key = (lab, wire.encode(req))
        if key not in self.trained:
            self.trained[key] = self._train_once(lab, req)
        got = self.trained[key]
        if isinstance(got, StudentError):
            self._record(RecordedCall(lab, req, error=got))
            raise got
        value, used = got
        self._record(RecordedCall(lab, req, value=value, used=used))
        return value, used

    def _train_once(self, lab: str, req: dict):
        """(value, Measured) of ``req`` in a fresh worker, or the StudentError it gave.
        Not ``measure``: that one maps every large allocation on its own for an exact
        memory peak, which slows a training loop, and a training is timed, not weighed."""
        worker = None
        try:
            # Known before the training starts: each reply tells the worker's clock what
            # moving the call's bytes is taken off (``_answer``).
            rate = self._framing_rate(lab) if self._relays(lab) else None
            worker = self._spawn(lab)
            if rate is not None:
                worker.on_callback = functools.partial(self._answer, lab, rate=rate)
            # The import counts: work done at import time (a model trained there) is the
            # training's too.
            before = self._cpu_reading(worker, final=False)
            self.reference_cpu_ns = 0
            moved = self.moved.copy()
            value = self._exchange(worker, lab, req)
            after = self._cpu_reading(worker, final=True)
            used = usage.measured(before, after, children_alive=worker.has_children())
            # What the course's reference computed for it (its lab 1's attention, say) is
            # the training's CPU time too: added here, each answer's own as the reference
            # worker timed it (``_reference_answer``; the student's worker sleeps while a
            # call is answered, and its clock counts the answers: ``Server.callback``).
            # Moving the calls' bytes is the relay's, taken off (``relay_cost``).
            relay_s = self._framing_s(lab, self.moved.since(moved), used.cpu_s)
            return value, replace(
                used, cpu_s=used.cpu_s - relay_s + self.reference_cpu_ns / 1e9,
                relay_s=relay_s)
        except StudentError as exc:
            return exc
        except OSError as exc:          # the worker's /proc went away: it is gone
            return StudentError(kind="crash", lab=lab,
                                message=f"the worker ended before it could be measured ({exc})")
        finally:
            if worker is not None:
                worker.kill()

    @staticmethod
    def _cpu_reading(worker: Worker, *, final: bool) -> usage.Usage:
        """The worker's accounting from /proc; where there is none (the portable backend on
        macOS, Windows), its CPU time from the OS (``portable.WorkerProcess.cpu_ns``:
        ``final`` ends the worker to read its total), else NotMeasuredHere."""
        if usage.accounting_available():
            return usage.reading(worker.pid)
        cpu_ns = worker.process.cpu_ns(final=final) if worker.process is not None else None
        if cpu_ns is None:
            raise NotMeasuredHere("The training's CPU time")
        return usage.Usage(resident=0, peak=0, cpu_ns=cpu_ns, child_faults=0, child_ticks=0)

    def _exchange(self, worker: Worker, lab: str, req: dict | None = None, *,
                  frame: bytes | None = None):
        """One request (``req``, or its encoded ``frame``) to ``worker`` and its reply's
        value, within the test's time."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self._timeout(lab)
        self.made += 1
        with self._waiting(lab):
            worker.send_ahead(wire.encode(req) if frame is None else frame, count=1)
            reply = worker.receive(timeout_s=remaining)
            self._credit_load(worker)
        return self._reply_value(worker, lab, reply)

    def _answer(self, lab: str, req, raw: wire.Raw | None = None, *,
                rate: relay_cost.FramingRate | None = None) -> Answer:
        """``_callback``'s value, the CPU time the reference's answer took and (at ``rate``)
        what moving the call's bytes cost the worker: the reply tells the student's worker,
        whose clock (``time.process_time``) then shows what its test is charged for the
        call. Counts the bytes moved (``moved``), a refused call's request too."""
        self.last_answer_cpu_ns = 0
        moved = relay_cost.Moved(request_bytes=len(raw.payload) if raw is not None else 0)
        self.moved.request_bytes += moved.request_bytes
        value = self._callback(lab, req, raw)
        if isinstance(value, wire.Raw):
            moved.reply_bytes = len(value.payload)
            self.moved.reply_bytes += moved.reply_bytes
        return Answer(value, self.last_answer_cpu_ns,
                      rate.of(moved) if rate is not None else 0)

    def _relays(self, lab: str) -> bool:
        """Whether ``lab``'s worker has its calls into other labs answered by the course's
        reference (``_spawn``)."""
        return bool(self.importable.get(lab)) and self.reference_dir is not None

    def _framing_rate(self, lab: str) -> relay_cost.FramingRate:
        """What moving a call's bytes costs a worker of ``lab`` (``relay_cost``), measured
        once per session in a fresh worker whose lab is never imported. A failure is the
        sandbox's (``fault``), never the student's."""
        rate = self.framing_rates.get(lab)
        if rate is not None:
            return rate
        if not usage.accounting_available():
            # No running worker's CPU to calibrate from (the portable backend on macOS or
            # Windows): nothing is taken off, and the figure is the indicative one it says.
            self.framing_rates[lab] = relay_cost.FramingRate()
            return self.framing_rates[lab]
        worker = self._spawn(lab)
        try:
            rate = relay_cost.calibrate(worker)
        except (WorkerTimeout, WorkerDied, RuntimeError, OSError) as exc:
            self.fault = self.fault or SandboxError(f"the relay's calibration failed: {exc}")
            raise StudentError(kind="crash", lab=lab,
                               message=f"the sandbox failed: {exc}") from None
        finally:
            worker.kill()
        self.framing_rates[lab] = rate
        return rate

    def _framing_s(self, lab: str, moved: relay_cost.Moved, cpu_s: float) -> float:
        """CPU seconds taken off a worker's ``cpu_s`` for moving ``moved`` (at most all)."""
        if not (moved.request_bytes or moved.reply_bytes):
            return 0.0
        return min(cpu_s, self._framing_rate(lab).of(moved) / 1e9)

    def _callback(self, lab: str, req, raw: wire.Raw | None = None) -> object:
        """The course's reference answering a call that ``lab``'s code made into another lab:
        checked and bounded here, computed in a reference worker (nothing runs in this
        trusted process but the relay of values). Raises (the student's call then raises,
        with the message) to refuse. ``raw``: the request as it came (``wire.Raw``): its
        bytes go on to the reference worker as they are, and its reply comes back as a
        ``wire.Raw`` to relay as it is (no tensor is rebuilt or copied here); else the
        reply's value."""
        if not isinstance(req, dict) or not isinstance(req.get("args"), list) \
                or not isinstance(req.get("kwargs"), dict) \
                or not isinstance(req.get("seed"), int) \
                or not isinstance(req.get("grad_outputs"), (list, type(None))):
            raise ValueError("a malformed call into another lab")
        inputs = [req["args"], list(req["kwargs"].values()), req["grad_outputs"] or []]
        sent = len(raw.payload) if raw is not None else sum(
            t.numel() * t.element_size() for t in protocol.flat_tensors(inputs))
        cap = self.relay_cap()
        if self.relayed_bytes > cap:
            # Refused for the cap and calling on: each frame would still be read in full.
            raise EndWorker(f"{lab} called another lab again after its calls had moved more "
                            f"than the {cap >> 20} MiB of tensors this test allows, and "
                            "were told so")
        self.relayed_bytes += sent          # refused or not, the relay has read its bytes
        other, target = req.get("lab"), req.get("target")
        if target not in (self.importable.get(lab) or {}).get(other, ()):
            raise ValueError(f"{other}.{target} is not importable by {lab} (only the "
                             "contract functions of earlier labs are)")
        size = sum(t.numel() for t in protocol.flat_tensors(inputs))
        if size > MAX_CALLBACK_ELEMENTS:
            raise ValueError(f"{other}.{target} was given more than {MAX_CALLBACK_ELEMENTS} "
                             "numbers")
        big = _largest_number(inputs)
        if big > MAX_CALLBACK_SCALAR:
            raise ValueError(f"{other}.{target} was given the number {big:.6g}: numbers that "
                             f"size work (lengths, positions, counts) are bounded by "
                             f"{MAX_CALLBACK_SCALAR} in calls into other labs")
        if self.relayed_bytes > cap:
            before = (self.relayed_bytes - sent) >> 20
            raise ValueError(
                f"this test's calls into other labs have moved {before} MiB of tensors to "
                f"and from the course's reference, and at most {cap >> 20} MiB may move in "
                f"this test ({MAX_RELAYED_BYTES_PER_SECOND >> 20} "
                f"MiB for each second of its time limit): a call into another lab copies its "
                f"inputs and its answer between processes, so pass it only what it needs "
                f"(compute large or repeated results once, in {lab}); a further call ends "
                f"the test")
        return self._reference_answer(lab, other, protocol.reference_call_request(req), raw)

    def relay_cap(self) -> int:
        """Bytes of tensors the current test's calls into other labs may move, both ways."""
        return int(MAX_RELAYED_BYTES_PER_SECOND * self.time_limit_s)

    def _reference_answer(self, lab: str, other: str, req: dict, raw: wire.Raw | None = None):
        """``req`` answered by the reference worker of (``lab``, ``other``), within the
        current test's time: its value (a ``wire.Raw`` of it with ``raw``, the student's
        request as it came), or ValueError / RuntimeError saying why not."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise RuntimeError("the test's time limit is spent")
        # A measured call's calls go to reference workers of its own (``measuring``).
        pool = self.measuring.workers if self.measuring is not None \
            else self.reference_workers
        worker = pool.get((lab, other))
        if worker is None or not worker.alive:
            try:
                worker = self.zygote.spawn(
                    submission=self.reference_dir, lab=other,
                    # What the calling lab may not use stays forbidden behind other's name.
                    forbidden=sorted({*self.forbidden.get(other, ()),
                                      *self.forbidden.get(lab, ())}),
                    importable=self.importable.get(other) or {}, answered_by="own")
            except SandboxError as exc:
                self.fault = self.fault or exc
                raise RuntimeError(f"the sandbox failed: {exc}") from None
            worker.reply_bytes = min(worker.reply_bytes, MAX_CALLBACK_REPLY_BYTES)
            self._watch(worker)
            pool[(lab, other)] = worker
            if self.measuring is not None:
                self.measuring.joined(worker)
        try:
            before = usage.reading(worker.pid).cpu_ns
        except OSError:
            before = None
        kept = reply = None
        try:
            if raw is None:
                reply = worker.request(req, timeout_s=remaining)
            else:
                # The request's header with the student's tensors' bytes, as they came.
                worker.send_parts_ahead(wire.parts(
                    {"op": protocol.REFERENCE_CALL, "call": raw.tree}, raw.payload), count=1)
                del raw
                reply, kept = worker.receive(timeout_s=remaining, raw=True)
        except WorkerTimeout:
            raise RuntimeError(f"the course's {other} did not answer within the test's time "
                               f"limit of {self.time_limit_s:g} s (its time is this "
                               "test's)") from None
        except WorkerDied as exc:
            raise RuntimeError(f"the course's {other} stopped on these inputs: a limit "
                               f"(memory, CPU time) or a reply over "
                               f"{worker.reply_bytes >> 20} MiB [{exc}]") from None
        finally:
            # What the call is charged (a training's CPU time, a measured call's): the
            # answer's own CPU time as the reference worker timed it (the course's code
            # around the reference function), never more than the kernel counted for the
            # whole exchange; the whole exchange where there is no such figure. Not the
            # relay's framing, which an inline computation would not have: at ~2.5 ms an
            # exchange it was three quarters of what lab 8's training through lab 1 was
            # charged for the reference's work (ok_lab8_own_lab1: 16.6 CPU-s of 4.1).
            spent = None
            with contextlib.suppress(OSError, TypeError):
                spent = usage.reading(worker.pid).cpu_ns - before
            told = reply.get("cpu_ns") if isinstance(reply, dict) else None
            if type(told) is int and told >= 0 and spent is not None:
                spent = min(spent, told)
            spent = max(0, spent or 0)
            self.reference_cpu_ns += spent
            self.last_answer_cpu_ns = spent
            if self.measuring is not None:
                self.measuring.spent(spent)
        if not isinstance(reply, dict):
            worker.kill()
            raise RuntimeError(f"the course's {other} sent a malformed reply")
        used = reply.get("forbidden")
        if isinstance(used, list) and used:
            raise ValueError(f"{lab} may not use {', '.join(sorted(map(str, used)))[:300]}, "
                             f"not even through {other}")
        error = reply.get("error")
        if isinstance(error, dict):
            raise ValueError(f"the course's {other}.{req['call']['target']} raised "
                             f"{_text(error.get('type'), 200)}: {_text(error.get('message'), 500)}")
        if "ok" not in reply:
            worker.kill()
            raise RuntimeError(f"the course's {other} sent a malformed reply")
        if kept is None:
            return reply["ok"]
        value = kept.part("ok")
        if value is None:                   # tensors outside its value: not relayed
            worker.kill()
            raise RuntimeError(f"the course's {other} sent a malformed reply")
        self.relayed_bytes += len(value.payload)
        return value

    def _end_reference_workers(self) -> None:
        for worker in self.reference_workers.values():
            worker.kill()
        self.reference_workers.clear()

    def _timeout(self, lab: str) -> StudentTimeout:
        return StudentTimeout(
            kind="timeout", lab=lab,
            message=f"time limit of {self.time_limit_s:g} s exceeded (an infinite loop, or "
                    "work that grows too fast with the input size?)",
        )

    def probe(self, lab: str, *, names: list[str] = (), file: str = "") -> StudentError | None:
        """Import the lab in a worker; why it cannot be graded (import error, missing names)."""
        try:
            missing = self.request(lab, protocol.probe_request(names))
        except StudentError as exc:
            return exc
        if isinstance(missing, list) and missing:
            return StudentError(
                kind="import", lab=lab, type_name="NameError",
                message=f"{', '.join(map(str, missing))} not defined; the lab contract requires "
                        f"{', '.join(names)} (a renamed or deleted definition?)")
        return None

    def _reference_folder(self, lab: str) -> str:
        """A private folder holding the course's reference file of ``lab`` alone, made once
        per session: a worker serving it runs the reference in the same conditions as the
        student's code (a resource test's yardstick, ``measure(reference=True)``)."""
        if lab not in self.references:
            with open(f"{self.solutions}/{lab}.py", "rb") as fh:
                source = fh.read()
            self.references[lab] = make_scratch({f"{lab}.py": source})
        return self.references[lab].name

    def close(self) -> None:
        for worker in self.workers.values():
            worker.kill()
        self.workers.clear()
        self._end_reference_workers()
        for scratch in self.references.values():
            scratch.cleanup()
        self.references.clear()


class _MeasuredReferences:
    """The reference workers answering a measured call's calls into other labs, fresh for
    it and ended with it: what they use in the measured call's window is the call's (#25,
    "what the reference worker spends for a student is the student's"). Those of its
    warm-up (or its import) pay their one-time costs there, as the student's worker does;
    from ``start`` each is in the call's memory cgroup (the cgroup's peak is then that of
    the worker and the reference workers together), or, without one, its resident peak
    is reset and what it rose by is added. CPU time: each answer's own, as the reference
    worker timed the course's function on the student's inputs (``spent``; at most what
    the kernel counted for the exchange), so the call pays for the work it handed over,
    not for the relay's framing, which an inline computation would not have. A reference
    worker first asked during the call itself joins at once."""

    def __init__(self):
        self.workers: dict = {}             # (calling lab, other lab) -> Worker
        self.group = None
        self.started = False
        self.cpu_ns = 0                     # the answers' CPU time since ``start``
        self.calls = 0
        self._base: dict = {}               # pid -> Usage at ``start`` (or when it joined)

    def joined(self, worker: Worker) -> None:
        if self.started:
            self._charge(worker)

    def start(self, group) -> None:
        self.group, self.started = group, True
        for worker in self.workers.values():
            if worker.alive:
                self._charge(worker)

    def spent(self, cpu_ns: int) -> None:
        if self.started:
            self.cpu_ns += max(0, cpu_ns)
            self.calls += 1

    def _charge(self, worker: Worker) -> None:
        try:
            if self.group is not None:
                self.group.add(worker.pid)
            else:
                usage.reset_peak(worker.pid)
            self._base[worker.pid] = usage.reading(worker.pid)
        except OSError:
            worker.kill()                   # not measurable: not used (its call fails)

    def used(self) -> Measured:
        """What the reference workers used since ``start``: the answers' CPU time, and
        (summed, an upper bound of their peak together) their resident peaks' rise."""
        peak = 0
        for worker in self.workers.values():
            base = self._base.get(worker.pid)
            if base is None:
                continue
            try:
                now = usage.reading(worker.pid)
            except OSError:
                continue
            peak += max(0, now.peak - max(base.resident, base.peak))
        return Measured(peak_bytes=peak, cpu_s=self.cpu_ns / 1e9, other_processes=False)

    def end(self) -> None:
        for worker in self.workers.values():
            worker.kill()
        self.workers.clear()


@dataclass
class Measurement:
    """What ``student.measure`` returns: the call's value and what the call used."""
    value: object
    peak_bytes: int             # peak memory of the call above its inputs (usage.charged)
    cpu_s: float                # CPU time of the worker's threads during the call
    other_processes: bool       # another process did part of the work: figures incomplete
    kept_bytes: int = 0         # held after the warm-up call (each test forgives part of it)
    inputs_bytes: int = 0       # the inputs' own bytes, taken off ``peak_bytes``


@dataclass
class GradResult:
    """What ``student.grad`` returns: the forward output and the gradients."""
    output: object
    input_grads: tuple
    param_grads: dict


def _largest_number(value, depth: int = 0) -> float:
    """The largest |x| of the numbers in ``value`` that may size work: Python numbers (not
    bools), every value of an integer tensor (a length, a position, a count passed as
    ``torch.tensor(n)``: ``range`` and ``torch.arange`` take it as they take ``n``), and the
    value of a one-element floating tensor (``torch.arange(torch.tensor(5e6))`` works too).
    NaN counts as nothing; an infinity as the largest number."""
    if depth > 16:
        return 0.0
    if isinstance(value, bool):
        return 0.0
    if isinstance(value, (int, float)):
        return float(min(abs(value), 10**300)) if value == value else 0.0
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.numel() == 0:
            return 0.0
        if value.is_floating_point() or value.is_complex():
            if value.numel() != 1:
                return 0.0          # data (queries, weights), not a size
            x = abs(complex(value.detach().reshape(()).item()))
            return float(min(x, 10**300)) if x == x else 0.0
        t = value.detach()
        # Python ints (no overflow at -2**63), no copy of the tensor.
        return float(max(abs(int(t.max().item())), abs(int(t.min().item()))))
    if isinstance(value, (list, tuple)):
        return max((_largest_number(v, depth + 1) for v in value), default=0.0)
    if isinstance(value, dict):
        return max((_largest_number(v, depth + 1) for v in value.values()), default=0.0)
    return 0.0


def _alike(value, gen: torch.Generator, depth: int = 0):
    """``value`` with every tensor redrawn by the grader: the same shape, dtype and kind,
    other values. Floating tensors: normal around the original's mean and spread (never
    the same numbers); integer tensors (tokens): uniform over the original's range; bool
    tensors (masks: the structure of the call, not its data) and Python values as they
    are. For a warm-up call that takes the measured call's code path without any of its
    data."""
    if depth > 16:
        return value
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.numel() == 0:
            return value.clone()
        if value.is_floating_point():
            ref = value.detach().double()
            spread = float(ref.std()) if value.numel() > 1 else 0.0
            spread = spread if spread > 0 and spread == spread else 1.0
            mean = float(ref.mean())
            mean = mean if mean == mean and abs(mean) < 1e30 else 0.0
            drawn = torch.randn(value.shape, generator=gen, dtype=torch.float64)
            return (mean + spread * drawn).to(value.dtype)
        if value.is_complex():
            return torch.randn(value.shape, generator=gen, dtype=value.dtype)
        lo, hi = int(value.min()), int(value.max())
        return torch.randint(lo, hi + 1, value.shape, generator=gen, dtype=torch.int64
                             ).to(value.dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_alike(v, gen, depth + 1) for v in value)
    if isinstance(value, dict):
        return {k: _alike(v, gen, depth + 1) for k, v in value.items()}
    return value


def _tensors_of(req: dict) -> list:
    return protocol.flat_tensors([req.get("args"), list((req.get("kwargs") or {}).values()),
                                  list((req.get("state_dict") or {}).values())])


def warmup_request(req: dict, warmup: tuple | str) -> dict:
    """The warm-up of the measured request ``req`` (see ``StudentLab.measure``): "alike"
    (its own arguments redrawn) or the positional arguments ``warmup``, with its keywords
    and a module's weights redrawn (``_alike``) from a generator seeded afresh. Refuses (a
    suite's bug) a warm-up that still holds one of the measured call's tensors."""
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    if isinstance(warmup, str):
        if warmup != "alike":
            raise ValueError(f"unknown warm-up {warmup!r}")
        args = _alike(req["args"], gen)
    else:
        args = list(warmup)
    first = {**req, "args": list(args), "kwargs": _alike(req["kwargs"], gen)}
    if req.get("state_dict") is not None:
        first["state_dict"] = _alike(req["state_dict"], gen)
    measured = [t for t in _tensors_of(req) if t.dtype != torch.bool and t.numel() >= 16]
    for t in _tensors_of(first):
        if t.dtype == torch.bool or t.numel() < 16:
            continue
        if any(m.shape == t.shape and m.dtype == t.dtype and torch.equal(m, t)
               for m in measured):
            raise ValueError("a warm-up call must not be given the measured call's inputs")
    return first


def _check_args(values) -> None:
    """Fail early, in the test's own process, on a value the wire cannot carry."""
    for v in values:
        if isinstance(v, (list, tuple)):
            _check_args(v)
        elif isinstance(v, dict):
            _check_args(v.values())
        elif not (v is None or isinstance(v, (torch.Tensor, bool, int, float, str))):
            raise TypeError(f"a test passed a {type(v).__name__} to student code")


class StudentLab:
    """The ``student`` fixture: one lab of the submission under test."""

    def __init__(self, session: Session, lab: str):
        self._session, self.lab = session, lab

    def _request(self, req: dict):
        _check_args(req.get("args", ()))
        _check_args(req.get("kwargs", {}).values())
        return self._session.request(self.lab, req)

    def call(self, name: str, *args, seed: int = 0, **kwargs):
        """``<lab>.<name>(*args, **kwargs)`` in the worker."""
        return self._request(protocol.call_request(name, args, kwargs, seed))

    def measure(self, name, *args, seed: int = 0, warmup: tuple | str | None = None,
                reference: bool = False, **kwargs) -> "Measurement":
        """``<lab>.<name>(*args, **kwargs)`` in a fresh worker of its own, measured by the
        grader from the kernel's accounting: the value, the peak memory above the inputs
        (bytes), the CPU time (s) of the call (``grader.sandbox.usage``) and the memory its
        warm-up left held (``kept_bytes``). ``warmup``: a first, unmeasured call of the same
        function in the same worker, so that one-time costs are not the call's: "alike",
        on inputs of the same shapes and kinds as the measured call's with other values
        drawn by the grader (the same code path, nothing of the measured inputs); or a
        tuple, the positional arguments of that call (the same keywords, drawn alike).
        A module's warm-up runs on other weights of the same shapes (``_alike``): no
        result the warm-up computes or caches is the measured call's. The warm-up runs
        before the worker holds the measured inputs (``Session.measure``).
        ``name``: a function's name, or a module method (``ModuleHandle.measure``).
        ``reference=True``: the course's reference measured the same way, in a worker like
        the student's (the yardstick of a work test: the same machine, load and limits)."""
        req = protocol.call_request(name, args, kwargs, seed)
        _check_args(req["args"])
        _check_args(req["kwargs"].values())
        first = None
        if warmup is not None:
            first = warmup_request(req, warmup)
            _check_args(first["args"])
        value, used = self._session.measure(self.lab, req, first, reference=reference)
        return Measurement(value=value, peak_bytes=used.peak_bytes, cpu_s=used.cpu_s,
                           other_processes=used.other_processes, kept_bytes=used.kept_bytes,
                           inputs_bytes=used.inputs_bytes)

    def train(self, name: str, model_class: str, *args, seed: int = 0,
              initial_state: dict | None = None, **kwargs) -> "Measurement":
        """``<lab>.<name>(*args, **kwargs)``, which builds a ``model_class`` (starting from
        the grader's ``initial_state``) and returns it trained, run once per submission
        (every test asking the same gets the same reply): ``value`` is the protocol's train
        reply (the returned weights, the loss history), ``cpu_s`` the CPU time the call
        took (the kernel's figure)."""
        req = protocol.train_request(name, model_class, args, kwargs, seed,
                                     initial_state=initial_state)
        _check_args(req["args"])
        _check_args(req["kwargs"].values())
        value, used = self._session.train(self.lab, req)
        return Measurement(value=value, peak_bytes=used.peak_bytes, cpu_s=used.cpu_s,
                           other_processes=used.other_processes, kept_bytes=used.kept_bytes,
                           inputs_bytes=used.inputs_bytes)

    def module(self, class_name: str, *args, **kwargs) -> "ModuleHandle":
        """A handle on ``<lab>.<class_name>(*args, **kwargs)``, built afresh for every call."""
        return ModuleHandle(self, class_name, list(args), kwargs)

    def grad(self, target, *args, grad_outputs, seed: int = 0, **kwargs) -> GradResult:
        """Forward and backward in the worker; gradients of sum(output * grad_output)."""
        spec = target._spec() if isinstance(target, ModuleHandle) else target
        res = self._request(protocol.grad_request(spec, args, kwargs, grad_outputs, seed))
        if not isinstance(res, dict) or set(res) != {"output", "input_grads", "param_grads"}:
            raise StudentError(kind="crash", lab=self.lab, message="malformed gradient reply")
        return GradResult(res["output"], tuple(res["input_grads"]), dict(res["param_grads"]))

    @contextlib.contextmanager
    def raises(self, type_name: str):
        """Pass only if the student's code raised ``type_name`` (or a subclass of it)."""
        try:
            yield
        except StudentError as exc:
            if exc.kind in ("exception",) and type_name in exc.mro:
                return
            if exc.kind != "exception":
                raise
            raise MissingRaise(
                f"expected a {type_name}, but your code raised {exc.type_name}"
                + (f" at {exc.where}" if exc.where else ""),
                hidden=f"expected a {type_name}, but your code raised "
                       + (exc.type_name if exc.type_name in SHOWN_EXCEPTIONS else "another exception"),
            ) from None
        raise MissingRaise(f"expected a {type_name} to be raised, but the call returned normally")


class ModuleHandle:
    """A student ``nn.Module`` described by its constructor call, weights and mode."""

    def __init__(self, lab: StudentLab, class_name: str, args: list, kwargs: dict):
        self._lab, self.class_name = lab, class_name
        self._ctor = {"args": args, "kwargs": kwargs}
        self._state_dict = None
        self._train = False
        self._dtype = None

    def _spec(self) -> dict:
        return protocol.module_spec(self.class_name, self._ctor["args"], self._ctor["kwargs"],
                                    state_dict=self._state_dict, train=self._train,
                                    dtype=self._dtype)

    def load_state_dict(self, state_dict: dict) -> "ModuleHandle":
        self._state_dict = {k: v.detach().clone() for k, v in state_dict.items()}
        return self

    def to(self, dtype: torch.dtype) -> "ModuleHandle":
        """Build the module in float32 or float64 (module.to(dtype) before loading weights)."""
        if dtype not in (torch.float32, torch.float64):
            raise ValueError("only float32 and float64 modules are supported")
        self._dtype = str(dtype).removeprefix("torch.")
        return self

    def train(self, mode: bool = True) -> "ModuleHandle":
        self._train = bool(mode)
        return self

    def eval(self) -> "ModuleHandle":
        return self.train(False)

    def state_dict(self) -> dict:
        sd = self._lab._request(protocol.state_dict_request(self._spec()))
        if not isinstance(sd, dict):
            raise StudentError(kind="crash", lab=self._lab.lab, message="malformed state dict")
        return sd

    def buffer(self, name: str) -> torch.Tensor:
        return self._lab._request(protocol.buffer_request(self._spec(), name))

    def __call__(self, *args, seed: int = 0, **kwargs):
        return self._lab._request(protocol.call_request(self._spec(), args, kwargs, seed))

    def measure(self, name: str, *args, seed: int = 0, warmup: tuple | str | None = None,
                reference: bool = False, **kwargs) -> "Measurement":
        """``module.<name>(*args, **kwargs)`` measured as ``StudentLab.measure`` measures a
        function (the module is built in the measured call: its weights count; its warm-up
        builds one of other weights)."""
        spec = {**self._spec(), "method": name}
        return self._lab.measure(spec, *args, seed=seed, warmup=warmup,
                                 reference=reference, **kwargs)

    def method(self, name: str, *args, seed: int = 0, **kwargs):
        """``module.<name>(*args, **kwargs)`` in the worker: a public method other than
        forward (e.g. ``generate``), on the module built as for ``__call__``."""
        spec = {**self._spec(), "method": name}
        return self._lab._request(protocol.call_request(spec, args, kwargs, seed))
