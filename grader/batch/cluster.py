"""A batch on a Dask cluster: ``grader batch ROOT --out DIR --scheduler ADDRESS``.

``grade_batch(..., scheduler=ADDRESS)`` lists and fingerprints the students, skips those
up to date and builds the gradebook exactly as a local batch does; only the transport
differs, and ``ClusterPool`` here stands in for the local ``Pool``:

- The client reads each submission with the intake, as a grading process would
  (``pool.submission_folder``: a zip unpacked safely here; then ``intake.sanitize``), and
  sends the lab files it found (at most 2 MiB each), with their problems and notes, as
  bytes: the workers need no shared file system. A submission refused at that point gets
  its zero result from the client at once.
- Each Dask worker process holds one ``grading.Grader`` (its sandbox zygote, a sandbox slot
  of its own on its machine, one pytest session, the call plans), started once by a worker
  plugin on a thread of its own that lives as long as the process: the zygote is killed
  when the *thread* that started it ends (``PR_SET_PDEATHSIG``), and Dask's task threads
  may come and go. ``import torch`` is paid once per worker process.
- A worker grades a student with the local pool's code (``pool.grade_with_retry``: a fault
  of the grader's own is retried once with a fresh Grader) into a private temporary
  folder, and returns that folder's files as bytes: results.json, feedback.html and, when
  the result may be reused, fingerprint.json. The client writes them into DIR atomically,
  in the local order (the old fingerprint first away, the new one last). So the files are
  the local batch's byte for byte (timings aside), and only the client writes into DIR.
- Before anyone is graded, every worker's course is checked against the client's
  (``course_identity``: sha256 of the rubric, of the suites with the course secret, of
  the solutions and of the grader's code); a worker that differs stops the batch with an
  error that names it and what differs (``CourseMismatch``).
- A worker that dies mid-student: the scheduler runs the task again on another worker,
  and the client writes the one result that comes back. A task whose workers died
  ``allowed-failures + 1`` times (the scheduler's ``distributed.scheduler.allowed-failures``,
  3 by default) ends as ``KilledWorker``: recorded "grading failed" (no fingerprint: the
  next run grades the student again), never as a score. A student past the budget of
  ``pool.student_budget_s`` is recorded the same way, and that worker's Grader replaced.

This module imports dask; ``grade_batch`` imports it only when given a scheduler.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import os
import queue
import re
import tempfile
import threading
import time
import uuid
from collections import deque
from pathlib import Path

from distributed import Client, WorkerPlugin, as_completed, get_worker
from distributed.scheduler import KilledWorker

from grader import paths
from grader.batch.fingerprints import course_digests
from grader.batch.pool import (INTERNAL_ERROR, START_TIMEOUT_S, _start_grader, _student_dir,
                               grade_with_retry, refusal_status, submission_folder,
                               write_student)
from grader.course import Course
from grader.errors import BatchError, CourseMismatch, GraderError, SubmissionError, UsageError
from grader.intake import Problem, Sanitized, sanitize
from grader.outputs.atomic import atomic_write_bytes
from grader.outputs.gradebook import failed_result
from grader.results import Fault

CONNECT_TIMEOUT_S = 30.0     # reaching the scheduler
WORKERS_TIMEOUT_S = 120.0    # the first worker joining, when none has yet
MAX_LAB_FILE_BYTES = 2 << 20     # a lab file sent to a worker (the intake caps them at 1 MiB)
SLOT_BASE = 100              # cluster workers' sandbox slots: 100, 101, ... per machine
                             # (a local batch on the same machine uses 0 .. jobs-1)
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}\Z")   # a file a worker returns

# What differs, in words, for each part of ``course_identity``.
_PARTS = {
    "rubric": "the rubric (rubric.yaml)",
    "suites": "the suites or the course secret (.grader-secret: hidden inputs derive from it)",
    "solutions": "the reference solutions (solutions/: a lab's imports get them)",
    "grader": "the grader's code (install the same version everywhere)",
}


# ----------------------------------------------------------------------------- the course

def _tree_digest(folder: Path, pattern: str) -> str:
    """sha256 of every ``pattern`` file under ``folder`` (relative path and bytes)."""
    h = hashlib.sha256()
    if folder.is_dir():
        for path in sorted(folder.rglob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(path.relative_to(folder).as_posix().encode() + b"\0")
                h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def course_identity(course: Course) -> dict[str, str]:
    """What every machine of a cluster must share to give the same grades (sha256 each):
    the rubric file, the suites with the course secret (as in a student's fingerprint), the
    reference solutions and the grader's own code."""
    return {**course_digests(course.rubric, course.secret),
            "solutions": _tree_digest(course.solutions, "*.py"),
            "grader": _tree_digest(paths.PACKAGE, "*.py")}


def this_workers_course(course: Course) -> dict[str, str]:
    """This machine's ``course_identity`` for ``course`` (the folder the client named). The
    course secret is read, never made: a worker with none has another course, and is told
    so."""
    if not course.secret_path.exists():
        raise CourseMismatch(f"{course.secret_path} does not exist on this worker: copy the "
                             "course's .grader-secret to it (hidden test inputs derive from it)")
    return course_identity(course)


def course_difference(expected: dict[str, str], found: dict[str, str]) -> list[str]:
    """The parts of two ``course_identity`` that differ, in words (empty: the same)."""
    return [_PARTS.get(part, part) for part in expected if found.get(part) != expected[part]]


# ----------------------------------------------------------------------------- a worker

def claim_slot() -> tuple[int, int]:
    """A sandbox slot no other process on this machine holds (its own uid in root mode):
    (slot, the fd of the lock that keeps it ours until this process ends)."""
    folder = Path(tempfile.gettempdir())
    for slot in range(SLOT_BASE, SLOT_BASE + 1000):
        try:
            fd = os.open(folder / f"grader-cluster-slot-{slot}.lock", os.O_RDWR | os.O_CREAT,
                         0o600)
        except OSError:
            continue                    # another user's lock file
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return slot, fd
        except OSError:
            os.close(fd)
    raise BatchError("no free sandbox slot on this machine (1000 grading processes?)")


def read_student_files(folder: Path) -> dict[str, bytes]:
    """What ``pool.write_student`` wrote for one student, by file name (temp files aside)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.is_file() and not p.name.startswith(".")}


class GradingService:
    """One Grader on a thread of its own, for as long as the Dask worker process lives.

    The thread starts the Grader (its zygote dies with the thread that launched it, so
    that thread must outlive every student) and then grades one job at a time from
    ``jobs``: (task, reply queue).
    """

    def __init__(self, course: Course, labs: list[str] | None):
        self.course, self.labs = course, labs
        self.jobs: queue.Queue = queue.Queue()
        self.ready = threading.Event()
        self.failure = ""              # why the Grader could not start ("" if it did)
        self.abandoned = False         # replaced after a student ran past the budget
        self.grader = None
        self.thread = threading.Thread(target=self._run, name="grader-cluster", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        slot_lock = None
        try:
            import torch
            # One thread: a worker process per core already fills the cores.
            torch.set_num_threads(1)
            slot, slot_lock = claim_slot()
            scored = self.course.rubric.only(self.labs)
            self.grader = _start_grader(self.course, slot, self.labs)
        except Exception as exc:  # noqa: BLE001 - reported with every job this worker gets
            self.failure = f"{type(exc).__name__}: {exc}"
            self.ready.set()
            if slot_lock is not None:
                os.close(slot_lock)
            return
        # As a local grading process does: what is loaded now stays out of every later
        # garbage collection (torch's ~200k objects).
        gc.collect()
        gc.freeze()
        self.ready.set()
        try:
            while not self.abandoned:
                job = self.jobs.get()
                if job is None or self.abandoned:
                    break
                task, answer = job
                try:
                    with tempfile.TemporaryDirectory(prefix="grader-cluster-") as out:
                        reply, self.grader = grade_with_retry(
                            task, grader=self.grader, course=self.course, scored=scored,
                            out=Path(out), slot=slot, labs=self.labs)
                        reply["files"] = read_student_files(Path(out) / task["student"])
                except Exception as exc:  # noqa: BLE001 - a fresh Grader could not start
                    self.failure = f"{type(exc).__name__}: {exc}"
                    answer.put(None)
                    break
                answer.put(reply)
        finally:
            with contextlib.suppress(Exception):
                self.grader.close(wait=False)
            os.close(slot_lock)

    def stop(self) -> None:
        """End the thread after its job, and its Grader (the zygote and sandbox go too)."""
        self.jobs.put(None)

    def abandon(self) -> None:
        """Stop a Grader that is stuck: its sandbox ends now, its thread when it returns."""
        self.abandoned = True
        self.jobs.put(None)
        with contextlib.suppress(Exception):
            self.grader.close(wait=False)


class GradingPlugin(WorkerPlugin):
    """On each Dask worker (those that join later too): check the course against the
    client's, then start the worker's ``GradingService``."""

    def __init__(self, *, name: str, expected: dict[str, str], course: str,
                 labs: list[str] | None):
        # ``course``: the course folder on the workers (the client names it: a worker finds
        # no course by itself); its identity must be ``expected``, the client's.
        self.name, self.expected, self.course, self.labs = name, expected, course, labs
        self.service: GradingService | None = None
        self.problem = ""
        self.lock: threading.Lock | None = None

    def __getstate__(self):
        return {"name": self.name, "expected": self.expected, "course": self.course,
                "labs": self.labs}

    def __setstate__(self, state):
        self.__init__(**state)

    def setup(self, worker) -> None:
        self.lock = threading.Lock()
        course = Course(self.course)
        try:
            differs = course_difference(self.expected, this_workers_course(course))
        except (CourseMismatch, GraderError) as exc:
            self.problem = f"Dask worker {worker.address}: {exc}"
        else:
            if differs:
                self.problem = (f"Dask worker {worker.address} has another course than this "
                                f"client: {'; '.join(differs)} differ(s)")
        if self.problem:
            raise CourseMismatch(self.problem)      # the client's register_plugin raises it
        self.service = GradingService(course, self.labs)   # starts in the background

    def teardown(self, worker) -> None:
        if self.service is not None:
            self.service.stop()

    def grade(self, task: dict, budget_s: float) -> dict:
        """Grade one student on this worker's service; one at a time (a worker thread each
        would only queue). A student past ``budget_s``: recorded as a grader fault."""
        if self.service is None:
            raise CourseMismatch(self.problem or "this Dask worker's grader is not set up")
        with self.lock:
            service = self.service
            if not service.ready.wait(START_TIMEOUT_S):
                raise BatchError(f"the grader of Dask worker {get_worker().address} did not "
                                 f"start in {START_TIMEOUT_S:g} s")
            if service.failure:
                raise BatchError(f"Dask worker {get_worker().address} could not start its "
                                 f"sandbox: {service.failure}")
            answer: queue.Queue = queue.Queue()
            started = time.monotonic()
            service.jobs.put((task, answer))
            try:
                reply = answer.get(timeout=budget_s)
            except queue.Empty:
                service.abandon()
                self.service = GradingService(service.course, self.labs)
                return {"student": task["student"], "seconds": time.monotonic() - started,
                        "status": f"{INTERNAL_ERROR}: took longer than {budget_s:g} s "
                                  "and was stopped", "fault": Fault.GRADER}
            if reply is None:
                raise BatchError(f"Dask worker {get_worker().address} could not restart its "
                                 f"sandbox: {service.failure}")
            return reply


def grade_on_worker(job: dict) -> dict:
    """The Dask task: one student (``job``: ``ClusterPool._job``), graded by this worker's
    plugin; returns plain data: the reply of ``pool.grade_task`` and the student's files."""
    plugin = get_worker().plugins.get(job["plugin"])
    if plugin is None:
        raise BatchError(f"Dask worker {get_worker().address} has no grader plugin "
                         f"{job['plugin']!r}")
    sent = job["submission"]
    for name, data in sent["files"].items():
        if len(data) > MAX_LAB_FILE_BYTES:
            raise BatchError(f"{name} is {len(data)} bytes: over {MAX_LAB_FILE_BYTES}")
    clean = Sanitized(files=dict(sent["files"]),
                      problems={lab: Problem(kind, message)
                                for lab, (kind, message) in sent["problems"].items()},
                      notes=list(sent["notes"]))
    task = {"student": job["student"], "kind": "sanitized", "sanitized": clean,
            "fingerprint": job["fingerprint"]}
    return plugin.grade(task, job["budget_s"])


# ----------------------------------------------------------------------------- the client

def write_student_files(out: Path, student: str, files: dict[str, bytes]) -> None:
    """A worker's files for ``student`` into ``out/student``, as ``pool.write_student``
    writes them: the old fingerprint first away, every file atomically, fingerprint.json
    (when the result may be reused) last."""
    for name in files:
        if not _FILE_NAME.match(name):
            raise BatchError(f"a worker returned a file named {name!r} for {student}")
    folder = _student_dir(out, student)
    with contextlib.suppress(FileNotFoundError):
        (folder / "fingerprint.json").unlink()
    for name, data in files.items():
        if name != "fingerprint.json":
            atomic_write_bytes(folder / name, data)
    if "fingerprint.json" in files:
        atomic_write_bytes(folder / "fingerprint.json", files["fingerprint.json"])


class ClusterPool:
    """The local ``Pool``'s part on a Dask cluster: ``run(tasks)``, then ``close()``.

    ``scheduler``: the scheduler's address (``tcp://host:8786``); ``course``: the batch's
    (its rubric has every lab); ``worker_course``: the course folder on the worker machines
    (default: ``course``'s folder, the same path there); ``labs``: the labs graded (None:
    all); ``budget_s``: the longest a student may take; ``on_done(reply)``: called once per
    student, after their files are written.
    """

    def __init__(self, *, scheduler: str, course: Course, out: Path, budget_s: float,
                 on_done, labs: list[str] | None = None,
                 worker_course: str | Path | None = None):
        self.course, self.out, self.budget_s, self.on_done = course, Path(out), budget_s, on_done
        self.rubric = course.rubric
        self.worker_course = str(worker_course or course.folder)
        self.labs = list(labs) if labs else None
        self.scored = self.rubric.only(self.labs)
        self.scheduler = scheduler
        self.plugin = f"grader-batch-{uuid.uuid4().hex[:12]}"
        self.pending: dict = {}             # future -> task
        try:
            self.client = Client(scheduler, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise UsageError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
        try:
            self._start_workers()
        except BaseException:
            self.close(wait=False)
            raise

    @property
    def workers(self) -> int:
        """Dask worker threads now (each grades one student at a time)."""
        return sum(self.client.nthreads().values())

    def _start_workers(self) -> None:
        try:
            self.client.wait_for_workers(1, timeout=WORKERS_TIMEOUT_S)
        except TimeoutError:
            raise BatchError(f"no Dask worker joined the scheduler at {self.scheduler} in "
                             f"{WORKERS_TIMEOUT_S:g} s (start one: dask worker "
                             f"{self.scheduler} --nthreads 1)") from None
        expected = course_identity(self.course)
        # Every worker checks its course and starts its Grader; a mismatch raises here,
        # before anyone is graded. Workers that join later get the plugin too.
        self.client.register_plugin(GradingPlugin(name=self.plugin, expected=expected,
                                                  course=self.worker_course, labs=self.labs),
                                    name=self.plugin)

    # -- one student ------------------------------------------------------------------------
    def _job(self, task: dict) -> dict | None:
        """What a worker needs for ``task``: the lab files as the intake read them. None if
        the submission is refused here (its zero result is written at once)."""
        student = task["student"]
        try:
            with submission_folder(task) as folder:
                clean = sanitize(folder, self.rubric, list(self.rubric.labs),
                                 solutions=self.course.solutions)
        except SubmissionError as exc:
            # As a local grading process records it: the student's own doing, reusable.
            write_student(self.out, student, failed_result(student, self.scored,
                                                           refusal_status(exc), Fault.STUDENT),
                          task["fingerprint"])
            self.on_done({"student": student, "status": refusal_status(exc),
                          "fault": Fault.STUDENT, "total": 0.0})
            return None
        except Exception as exc:  # noqa: BLE001 - one student's failure must not stop the batch
            self._failed(task, f"{INTERNAL_ERROR}: {type(exc).__name__}: {exc}", 0.0)
            return None
        for name, data in clean.files.items():
            if len(data) > MAX_LAB_FILE_BYTES:
                self._failed(task, f"{INTERNAL_ERROR}: {name} is over "
                                   f"{MAX_LAB_FILE_BYTES >> 20} MiB", 0.0)
                return None
        return {"plugin": self.plugin, "student": student, "fingerprint": task["fingerprint"],
                "budget_s": self.budget_s,
                "submission": {"files": dict(clean.files),
                               "problems": {lab: (p.kind, p.message)
                                            for lab, p in clean.problems.items()},
                               "notes": list(clean.notes)}}

    def _failed(self, task: dict, reason: str, seconds: float) -> None:
        """A grader fault: the zero result, no fingerprint (the next run grades again)."""
        student = task["student"]
        write_student(self.out, student,
                      failed_result(student, self.scored, reason, Fault.GRADER), None)
        self.on_done({"student": student, "status": reason, "fault": Fault.GRADER,
                      "total": 0.0, "seconds": seconds})

    def _finish(self, future, task: dict) -> None:
        seconds = time.monotonic() - task["submitted"]
        try:
            reply = future.result()
        except KilledWorker as exc:
            self._failed(task, f"{INTERNAL_ERROR}: the Dask workers grading it died "
                               f"{exc.allowed_failures + 1} times", seconds)
            return
        except (BatchError, UsageError):
            raise                           # a worker that cannot grade stops the batch
        except Exception as exc:  # noqa: BLE001 - recorded, as a local grading fault is
            self._failed(task, f"{INTERNAL_ERROR}: {type(exc).__name__}: {exc}", seconds)
            return
        files = reply.pop("files", None)
        if files is None:                   # stopped on its worker (past the budget)
            self._failed(task, reply["status"], seconds)
            return
        write_student_files(self.out, task["student"], files)
        self.on_done(reply)

    # -- the batch --------------------------------------------------------------------------
    def run(self, tasks: deque) -> None:
        """Hand out ``tasks`` (a few per worker thread at a time, so a worker that joins
        gets work and memory stays bounded) until every student is written."""
        done = as_completed(loop=self.client.loop)
        window, checked = 0, 0.0

        def submit_more() -> None:
            nonlocal window, checked
            if time.monotonic() - checked > 1.0:
                window, checked = max(4, 2 * self.workers), time.monotonic()
            while tasks and len(self.pending) < window:
                task = tasks.popleft()
                job = self._job(task)
                if job is None:
                    continue
                future = self.client.submit(grade_on_worker, job, pure=False,
                                            key=f"grade-{task['student']}-{uuid.uuid4().hex[:8]}")
                self.pending[future] = {**task, "submitted": time.monotonic()}
                done.add(future)

        submit_more()
        for future in done:
            task = self.pending.pop(future)
            try:
                self._finish(future, task)
            finally:
                future.release()
            submit_more()

    def close(self, *, wait: bool = True) -> None:
        """Forget what is left (Ctrl-C: ``wait=False``), end the workers' Graders (the
        plugin's teardown) and disconnect. A worker finishes a student it has begun, and
        nothing of it is written."""
        client, self.client = getattr(self, "client", None), None
        if client is None:
            return
        with contextlib.suppress(Exception):
            if self.pending:
                client.cancel(list(self.pending), force=True)
            self.pending.clear()
        with contextlib.suppress(Exception):     # the workers' Graders end with it
            client.unregister_worker_plugin(self.plugin)
        with contextlib.suppress(Exception):
            client.close(timeout=10 if wait else 2)
