"""The pool: N grading processes, each grading one student at a time with its own Grader.

The processes come from a 'forkserver' that has imported torch and the engine (never a fork
of a process that ran torch ops), so torch is imported once per batch; each keeps one
``grading.Grader`` (its own sandbox zygote, ``slot=i`` or the next free one, so no two zygotes share
uids, and one pytest session). A student's ``results.json``, ``feedback.html`` and then
``fingerprint.json`` are written atomically by the process that graded them, before it
reports back a one-line status. A process that dies or overruns the student's time budget
is killed and replaced; that student's status says so, and nobody else is affected.

Ctrl-C is the batch process's to handle: a terminal sends SIGINT to the whole process
group, and grading processes ignore it (as the forkserver does), so the batch process stops
them by pid (``Pool.close(wait=False)``) and says once how far it got; no process prints a
traceback of its own.
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing
import os
import signal
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

from grader.course import Course
from grader.errors import BatchError, SubmissionError, ZipRejected
from grader.engine.lab_clock import OUTSIDE, LabClock, by_lab
from grader.grading import ENGINE_MODULES, Grader, retry_with_a_fresh_grader
from grader.intake.zips import unpack_zip
from grader.outputs.atomic import atomic_write_text, use_output_mode
from grader.outputs.gradebook import failed_result
from grader.outputs.gradescope import write_gradescope
from grader.outputs.html import write_feedback_html
from grader.results import Fault
from grader.rubric import Rubric
from grader.sandbox.jail import PR_SET_PDEATHSIG, prctl

START_TIMEOUT_S = 300.0      # a grading process imports torch and starts its zygote
BUDGET_MARGIN_S = 120.0      # on top of the rubric's time limits, before a student is cut off
INTERNAL_ERROR = "grading failed"   # the words a grader fault's status starts with (for people)


def _student_dir(out: Path, student: str) -> Path:
    folder = Path(out) / student
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(".*.json.*"):      # temp files of a write that was killed
        with contextlib.suppress(OSError):
            stale.unlink()
    return folder


def write_student(out: Path, student: str, result, fingerprint: dict | None) -> None:
    """results.json and feedback.html, then (when reusable) fingerprint.json, all atomic.

    The old fingerprint goes first: a kill at any point leaves either no fingerprint (the
    student is graded again) or a fingerprint that matches the results beside it.
    """
    folder = _student_dir(out, student)
    with contextlib.suppress(FileNotFoundError):
        (folder / "fingerprint.json").unlink()
    write_gradescope(result, folder / "results.json")
    write_feedback_html(result, folder / "feedback.html")
    if fingerprint is not None:
        atomic_write_text(folder / "fingerprint.json", json.dumps(fingerprint, indent=2) + "\n")


def resident_mb() -> float:
    """This process's resident memory now (VmRSS), in MiB."""
    with contextlib.suppress(OSError, ValueError, IndexError), \
            open("/proc/self/status", encoding="ascii", errors="replace") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@contextlib.contextmanager
def submission_folder(task: dict):
    """The folder of a task's submission: its own, or its zip unpacked into a private
    temporary folder (mode 0700), removed afterwards. ZipRejected if the zip is refused."""
    if task["kind"] != "zip":
        yield Path(task["path"])
        return
    with tempfile.TemporaryDirectory(prefix="grader-zip-") as private:
        unpack_zip(Path(task["path"]), Path(private))
        yield Path(private)


def refusal_status(exc: SubmissionError) -> str:
    """A student's status when their submission cannot be graded at all."""
    return f"rejected zip: {exc}" if isinstance(exc, ZipRejected) else str(exc)


def grade_task(task: dict, *, rubric: Rubric, out: Path, grader: Grader,
               labs: list[str] | None = None, clock: LabClock | None = None) -> dict:
    """Grade one student in this (trusted) process and write their files; never raises.

    ``labs``: the labs to grade (default: all); ``rubric`` is what the result is scored out
    of (those labs only). A failure of the grader's own (``restart`` in the reply) is
    recorded as ``INTERNAL_ERROR``, with no fingerprint, so the next run grades the student
    again. ``clock``: this process's ``LabClock`` of ``grader``'s sandbox, kept from one
    student to the next (what happens between two students is the next one's); default:
    one from now. The reply's ``cpu_s`` (CPU seconds of this process and its sandbox) is
    ``cpu_by_lab_s`` (lab -> seconds) plus ``cpu_outside_labs_s`` (sanitizing, scoring,
    writing the files, workers' exits).
    """
    student, started = task["student"], time.monotonic()
    if clock is None or clock.sandbox_pid != grader.sandbox_pid:
        clock = LabClock(grader.sandbox_pid)
    fingerprint = task["fingerprint"]
    restart = False
    try:
        if task["kind"] == "sanitized":     # read by a cluster's client (grader.batch.cluster)
            result = grader.grade_sanitized(task["sanitized"], name=student, labs=labs,
                                            clock=clock)
        else:
            with submission_folder(task) as folder:
                result = grader.grade(folder, name=student, labs=labs, clock=clock)
    except SubmissionError as exc:
        result = failed_result(student, rubric, refusal_status(exc), Fault.STUDENT)
    except Exception as exc:  # noqa: BLE001 - one student's failure must not stop the batch
        result = failed_result(student, rubric, f"{INTERNAL_ERROR}: {type(exc).__name__}: {exc}",
                               Fault.GRADER)
        fingerprint = None                       # not the student's doing: try again next run
        restart = True                           # and with a fresh sandbox and pytest session
    write_student(out, student, result, fingerprint)
    clock.switch(OUTSIDE)                   # a grading cut short left its lab in force
    spent = by_lab(clock.take())
    outside = spent.pop(OUTSIDE, 0.0)
    return {"student": student, "status": result.status, "fault": result.fault,
            "total": result.score,
            "seconds": time.monotonic() - started,
            "cpu_s": sum(spent.values()) + outside, "cpu_by_lab_s": spent,
            "cpu_outside_labs_s": outside,
            "rss_mb": resident_mb(), "restart": restart}


def _die_with_parent() -> None:
    """SIGKILL this process when its parent goes (also when it is SIGKILLed).

    The parent is the forkserver, which exits as soon as the batch process is gone.
    """
    parent = os.getppid()
    with contextlib.suppress(Exception):
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:          # it went before the signal was armed
        os._exit(1)


def _start_grader(course: Course, slot: int, labs: list[str] | None = None) -> Grader:
    """A started Grader of ``course`` (slot ``slot``: its own sandbox uid) with its call
    plan for ``labs`` recorded now, not in the first student's time."""
    grader = Grader(course, send_ahead=True, slot=slot)
    try:
        return grader.prepare(labs)
    except BaseException:
        grader.close()
        raise


def grade_with_retry(task: dict, *, grader: Grader, course: Course, scored: Rubric,
                     out: Path, slot: int, labs: list[str] | None,
                     clock: LabClock | None = None) -> tuple[dict, Grader]:
    """``grade_task``; on a fault of the grader's own, once more with a fresh Grader (which
    is returned: the caller keeps it). If it fails again the student stays marked "grading
    failed" (no fingerprint: the next run grades them again); never a score. ``clock``:
    as for ``grade_task`` (a fresh Grader gets a fresh one there)."""
    return retry_with_a_fresh_grader(
        grader, lambda: _start_grader(course, slot, labs),
        lambda g: grade_task(task, rubric=scored, out=out, grader=g, labs=labs, clock=clock),
        lambda reply: reply.pop("restart"))


def _grading_process(slot: int, conn, course: Course, out: Path,
                     labs: list[str] | None = None) -> None:
    """A grading process: one Grader, then one student per message until told to stop.

    ``course``: the batch's (its rubric already checked, its secret already read: the
    process gets it as an argument, never from the environment); its rubric has every lab
    (a lab may import another); ``labs``: the labs it grades, and scores out of (default:
    all).
    """
    # Ctrl-C reaches the whole process group: the batch process handles it and stops this
    # one by pid. Ignored from here on (and by the zygote this process starts, which
    # inherits it), so no grading process prints a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    use_output_mode(course.output_mode)     # the student files this process writes
    scored = course.rubric.only(labs)
    import torch
    # One thread: N processes already fill N cores, and small ops run faster single-threaded.
    torch.set_num_threads(1)

    try:
        # One sandbox and one pytest session for every student of this process: the suites
        # are configured, imported and collected once, not once per student.
        grader = _start_grader(course, slot, labs)
    except Exception as exc:  # noqa: BLE001 - reported to the batch, which stops
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    # Keep what is loaded now (torch, pytest, the engine) out of every later garbage
    # collection: with torch imported, a full collection walks ~200k objects.
    gc.collect()
    gc.freeze()
    # One clock for this process's sandbox, kept from student to student: every CPU-second
    # after this is some student's (a lab's, or outside the labs).
    clock = LabClock(grader.sandbox_pid)
    conn.send(("ready",))
    try:
        while True:
            try:
                task = conn.recv()
            except EOFError:
                break
            if task is None:
                break
            if clock.sandbox_pid != grader.sandbox_pid:        # a fresh Grader after a fault
                clock = LabClock(grader.sandbox_pid)
            reply, grader = grade_with_retry(task, grader=grader, course=course, scored=scored,
                                             out=out, slot=slot, labs=labs, clock=clock)
            conn.send(("done", reply))
    finally:
        grader.close()


@dataclass
class _Slot:
    index: int
    process: multiprocessing.Process
    conn: object
    ready: bool = False          # the process said it has started its zygote
    task: dict | None = None     # the student it is grading
    since: float = 0.0           # when it was started, or given its task


class Pool:
    """N grading processes, each given one student at a time; dead ones are replaced."""

    def __init__(self, *, jobs: int, course: Course, out: Path, budget_s: float, on_done,
                 labs: list[str] | None = None):
        # forkserver, not fork: the batch process may have run torch ops (a forked OpenMP
        # pool deadlocks). The server imports torch and the engine once (no ops) and forks
        # every grading process from there, so a restart costs no second torch import.
        self.context = multiprocessing.get_context("forkserver")
        # quiet_interrupt first: the server ignores Ctrl-C from before it imports torch.
        # (``grader.grading`` itself loads no engine: see ``grading.load_engine``.)
        self.context.set_forkserver_preload(["grader.batch.quiet_interrupt", "torch",
                                             "grader.grading", *ENGINE_MODULES])
        self.course, self.out, self.budget_s, self.on_done = course, out, budget_s, on_done
        self.labs = list(labs) if labs else None
        self.scored = course.rubric.only(self.labs)       # what a failed student scores out of
        self.slots: dict[int, _Slot] = {}
        try:
            for index in range(jobs):   # started from the main thread (PDEATHSIG is per thread)
                self._start(index)
        except BaseException:           # Ctrl-C while starting: none is left behind
            self.close(wait=False)
            raise

    def _start(self, index: int) -> None:
        ours, theirs = self.context.Pipe()
        process = self.context.Process(
            target=_grading_process, name=f"grader-batch-{index}",
            args=(index, theirs, self.course, self.out, self.labs), daemon=True)
        process.start()
        theirs.close()
        self.slots[index] = _Slot(index, process, ours, since=time.monotonic())

    def run(self, tasks: deque) -> None:
        """Hand out ``tasks`` until every one is done (or recorded as failed)."""
        while tasks or any(s.task for s in self.slots.values()):
            if not self.slots:
                raise BatchError("no grading process is left")
            waitables = {}
            for slot in self.slots.values():
                waitables[slot.conn] = slot
                waitables[slot.process.sentinel] = slot
            for ready in wait(list(waitables), timeout=1.0):
                slot = waitables[ready]
                if self.slots.get(slot.index) is not slot:
                    continue                      # replaced while handling its other handle
                if ready is slot.conn:
                    self._message(slot, tasks)
                else:
                    self._died(slot, tasks, "the grading process died (exit code "
                                            f"{slot.process.exitcode})")
            self._watchdog(tasks)

    def _message(self, slot: _Slot, tasks: deque) -> None:
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):
            slot.process.join(timeout=5)
            self._died(slot, tasks, "the grading process died (exit code "
                                    f"{slot.process.exitcode})")
            return
        if message[0] == "failed":
            raise BatchError(f"a grading process could not start its sandbox: {message[1]}")
        if message[0] == "done":
            slot.task = None
            self.on_done(message[1])
        slot.ready = True
        if tasks:
            slot.task, slot.since = tasks.popleft(), time.monotonic()
            slot.conn.send(slot.task)

    def _died(self, slot: _Slot, tasks: deque, why: str) -> None:
        """Record the student it was grading as failed, and replace it if work is left."""
        self._stop(slot)
        del self.slots[slot.index]
        if not slot.ready and slot.task is None:
            raise BatchError(f"a grading process stopped while starting: {why}")
        if slot.task is not None:
            student, reason = slot.task["student"], f"{INTERNAL_ERROR}: {why}"
            write_student(self.out, student,
                          failed_result(student, self.scored, reason, Fault.GRADER), None)
            self.on_done({"student": student, "status": reason, "fault": Fault.GRADER,
                          "total": 0.0, "seconds": time.monotonic() - slot.since})
        if tasks:
            self._start(slot.index)

    def _watchdog(self, tasks: deque) -> None:
        now = time.monotonic()
        for slot in list(self.slots.values()):
            if slot.task is not None and now - slot.since > self.budget_s:
                self._died(slot, tasks, f"took longer than {self.budget_s:g} s and was stopped")
            elif not slot.ready and now - slot.since > START_TIMEOUT_S:
                raise BatchError(f"a grading process did not start in {START_TIMEOUT_S:g} s")

    @staticmethod
    def _stop(slot: _Slot) -> None:
        # By its own pid only: its zygote and the zygote's workers die with it (PDEATHSIG).
        if slot.process.is_alive():
            slot.process.kill()
        slot.process.join(timeout=10)
        with contextlib.suppress(OSError):
            slot.conn.close()

    def close(self, *, wait: bool = True) -> None:
        """Ask every process to finish, then stop any that has not; ``wait=False`` (Ctrl-C):
        stop them all now, each by its pid (its zygote and workers die with it)."""
        if not wait:
            for slot in self.slots.values():
                self._stop(slot)
            self.slots.clear()
            return
        for slot in self.slots.values():
            with contextlib.suppress(OSError, ValueError):
                slot.conn.send(None)
        deadline = time.monotonic() + 10
        for slot in self.slots.values():
            slot.process.join(timeout=max(0.1, deadline - time.monotonic()))
            self._stop(slot)
        self.slots.clear()


def student_budget_s(rubric: Rubric) -> float:
    """The longest one student may take: every test and every import at its time limit."""
    tests = sum(t.time_limit_s for lab in rubric.labs.values() for t in lab.tests.values())
    imports = sum(lab.time_limit_s for lab in rubric.labs.values())
    return tests + imports + BUDGET_MARGIN_S
