"""Grade a whole class: parallel, resumable batch grading (``grader batch ROOT --out DIR``).

Each entry of ROOT is one student: a folder of lab files, or a ``.zip`` of one; the entry's
name (without ``.zip``) is the student id; hidden entries are ignored.

How it runs:

- The main process lists the students and fingerprints each (the submission's bytes, the
  rubric, the suites). A student whose ``DIR/<student>/fingerprint.json`` matches is up to
  date and skipped; an entry that cannot be graded at all (a rejected zip, a stray file)
  gets its zero result right away, without starting torch.
- The rest go, one student at a time, to N grading processes. They come from a
  'forkserver' that has imported torch and the engine (never a fork of a process that ran
  torch ops), so torch is imported once per batch, and each keeps its own sandbox zygote
  (``Zygote(slot=i)``, so concurrent workers get distinct uids). It grades with
  ``grade_submission``, the engine of ``grader grade``, and writes ``results.json`` and then
  ``fingerprint.json``, both atomically, before it reports back a one-line status. Results
  are never collected in memory.
- A grading process that dies or overruns the student's time budget is killed and
  replaced; that student's status says what happened, and nobody else is affected.
- At the end the gradebook (grades.csv, summary.json, plots) is rebuilt from every
  student's results.json (``grader.gradebook``), so a batch killed at any moment and run
  again ends with the same gradebook as an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import multiprocessing
import os
import re
import resource
import signal
import stat
import sys
import tempfile
import time
import zipfile
from collections import deque
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

from grader import paths
from grader.gradebook import build_gradebook, failed_result, read_results
from grader.results import atomic_write_text, write_gradescope
from grader.feedback import write_feedback_html
from grader.rubric import Rubric, load_rubric

ZIP_MAX_MEMBERS = 200
ZIP_MAX_TOTAL_BYTES = 20 << 20
ZIP_MAX_MEMBER_BYTES = 2 << 20
START_TIMEOUT_S = 300.0      # a grading process imports torch and starts its zygote
BUDGET_MARGIN_S = 120.0      # on top of the rubric's time limits, before a student is cut off
GRADEBOOK_FILES = ("grades.csv", "summary.json", "score_histogram.png", "test_pass_rates.png")
INTERNAL_ERROR = "grading failed"   # statuses that are the grader's fault start with this
ETA_WINDOW = 50                      # students whose pace the plain progress lines extrapolate


# ------------------------------------------------------------------------- students

@dataclass(frozen=True)
class Entry:
    """One student's submission in ROOT."""
    student: str
    path: Path
    kind: str                    # folder | zip | other
    problem: str = ""            # why it cannot be graded at all ("" when it can)


def list_students(root: Path, *, out: Path | None = None) -> list[Entry]:
    """The students of ROOT, sorted by id; skips hidden entries and the output folder."""
    root = Path(root)
    by_id: dict[str, list[Entry]] = {}
    for path in sorted(root.iterdir(), key=lambda p: p.name):
        name = path.name
        if name.startswith(".") or (out is not None and _same_path(path, out)):
            continue
        if path.is_symlink():
            entry = Entry(name, path, "other", f"{name} is a symbolic link; put the "
                                               "submission itself in the folder")
        elif path.is_dir():
            entry = Entry(name, path, "folder")
        elif path.is_file() and name.lower().endswith(".zip"):
            entry = Entry(name[:-4], path, "zip")
        else:
            entry = Entry(name, path, "other", f"{name} is not a folder or a .zip file")
        by_id.setdefault(entry.student, []).append(entry)
    entries = []
    for student, found in sorted(by_id.items()):
        entry = found[0]
        if len(found) > 1:
            names = ", ".join(e.path.name for e in found)
            entry = Entry(student, entry.path, "other",
                          f"more than one submission for {student} ({names}); keep one")
        elif student in GRADEBOOK_FILES:
            entry = Entry(student, entry.path, "other",
                          f"{entry.path.name} has the name of a gradebook file; rename it")
        entries.append(entry)
    return entries


def _same_path(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


# ------------------------------------------------------------------------- fingerprints

def _hash_file(h, path: Path) -> None:
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)


def submission_digest(entry: Entry) -> str:
    """sha256 of what is graded: the zip's bytes, or every file of the folder (by path)."""
    h = hashlib.sha256()
    if entry.problem:
        h.update(b"problem\0" + entry.problem.encode("utf-8", "surrogateescape"))
    elif entry.kind == "zip":
        h.update(b"zip\0")
        _hash_file(h, entry.path)
    else:
        for dirpath, dirnames, filenames in os.walk(entry.path, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
            for name in sorted(filenames):
                path = Path(dirpath) / name
                rel = os.fsencode(path.relative_to(entry.path).as_posix())  # any name bytes
                if path.is_symlink():
                    h.update(b"link\0" + rel + b"\0" + os.fsencode(os.readlink(path)) + b"\0")
                elif path.is_file():
                    h.update(b"file\0" + rel + b"\0" + str(path.stat().st_size).encode() + b"\0")
                    with contextlib.suppress(OSError):   # unreadable: graded as such
                        _hash_file(h, path)
    return h.hexdigest()


def course_digests(rubric: Rubric) -> dict[str, str]:
    """sha256 of the rubric file and of the suites (every .py and pytest.ini under suites/)."""
    rubric_hash = hashlib.sha256(Path(rubric.path).read_bytes()).hexdigest()
    h = hashlib.sha256()
    for path in sorted(paths.SUITES.rglob("*")):
        if path.is_file() and (path.suffix == ".py" or path.name == "pytest.ini") \
                and "__pycache__" not in path.parts:
            h.update(path.relative_to(paths.SUITES).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return {"rubric": rubric_hash, "suites": h.hexdigest()}


def is_up_to_date(student_dir: Path, fingerprint: dict) -> bool:
    try:
        stored = json.loads((student_dir / "fingerprint.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return stored == fingerprint and read_results(student_dir / "results.json") is not None


# ------------------------------------------------------------------------- zip files

class ZipRejected(Exception):
    """A zip that will not be unpacked; the message says why (it becomes the status)."""


def _member_parts(name: str) -> list[str]:
    if name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name):
        raise ZipRejected(f"member {name!r} has an absolute path")
    parts = [p for p in re.split(r"[\\/]", name) if p not in ("", ".")]
    if ".." in parts:
        raise ZipRejected(f"member {name!r} points outside the folder ('..')")
    return parts


def check_zip(path: Path) -> list[zipfile.ZipInfo]:
    """The members of a zip that is safe to unpack; ZipRejected otherwise.

    Refused: more than ZIP_MAX_MEMBERS members, an absolute or '..' path, a symbolic link
    or other non-regular member, an encrypted member, a member over ZIP_MAX_MEMBER_BYTES
    or more than ZIP_MAX_TOTAL_BYTES in all (uncompressed), two members with one name.
    """
    try:
        with zipfile.ZipFile(path) as zf:
            members = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise ZipRejected(f"not a readable zip file ({exc})") from None
    if len(members) > ZIP_MAX_MEMBERS:
        raise ZipRejected(f"has {len(members)} members; the limit is {ZIP_MAX_MEMBERS}")
    total, seen = 0, set()
    for info in members:
        parts = _member_parts(info.filename)
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise ZipRejected(f"member {info.filename!r} is a symbolic link")
        if stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise ZipRejected(f"member {info.filename!r} is not a regular file or folder")
        if info.flag_bits & 0x1:
            raise ZipRejected(f"member {info.filename!r} is encrypted")
        if info.file_size > ZIP_MAX_MEMBER_BYTES:
            raise ZipRejected(f"member {info.filename!r} is {info.file_size / 2**20:.1f} MB "
                              f"uncompressed; the limit is {ZIP_MAX_MEMBER_BYTES >> 20} MB")
        total += info.file_size
        if total > ZIP_MAX_TOTAL_BYTES:
            raise ZipRejected(f"more than {ZIP_MAX_TOTAL_BYTES >> 20} MB uncompressed in total")
        key = "/".join(parts)
        if key in seen and not info.is_dir():
            raise ZipRejected(f"member {info.filename!r} appears twice")
        seen.add(key)
    return members


def unpack_zip(path: Path, dest: Path) -> None:
    """Unpack a zip that ``check_zip`` accepts into the empty folder ``dest``.

    Only folders and regular files are created, with O_EXCL|O_NOFOLLOW, and the size caps
    are enforced again on the bytes actually decompressed (a member may understate them).
    """
    members = check_zip(path)
    total = 0
    try:
        with zipfile.ZipFile(path) as zf:
            for info in members:
                parts = _member_parts(info.filename)
                if not parts:
                    continue
                target = Path(dest, *parts)
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out, zf.open(info) as src:
                    size = 0
                    while chunk := src.read(1 << 16):
                        size += len(chunk)
                        total += len(chunk)
                        if size > ZIP_MAX_MEMBER_BYTES or total > ZIP_MAX_TOTAL_BYTES:
                            raise ZipRejected(f"member {info.filename!r} unpacks to more than "
                                              "the size limits")
                        out.write(chunk)
    except ZipRejected:
        raise
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError) as exc:
        raise ZipRejected(f"could not be unpacked ({exc})") from None


# ------------------------------------------------------------------------- one student

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


def cpu_seconds(zygote) -> float:
    """CPU time of this process, plus its zygote's and the workers the zygote has reaped."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    total = usage.ru_utime + usage.ru_stime
    pid = getattr(zygote, "pid", None) or getattr(getattr(zygote, "_proc", None), "pid", None)
    with contextlib.suppress(OSError, ValueError, IndexError, TypeError):
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        # utime, stime, cutime, cstime (fields 14-17 of proc(5)), in clock ticks
        total += sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def resident_mb() -> float:
    """This process's resident memory now (VmRSS), in MiB."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    return 0.0


def _zygote_alive(zygote) -> bool:
    # The Zygote has no public liveness check; its process handle is enough here.
    proc = getattr(zygote, "_proc", None)
    return proc is not None and proc.poll() is None


def grade_task(task: dict, *, rubric: Rubric, out: Path, zygote, runner=None) -> dict:
    """Grade one student in this (trusted) process and write their files; never raises."""
    from grader.grading import SubmissionError, grade_submission
    from grader.sandbox import SandboxError
    from grader.suite_runner import RunnerError

    student, started, cpu = task["student"], time.monotonic(), cpu_seconds(zygote)
    fingerprint = task["fingerprint"]
    restart = restart_runner = False
    try:
        with contextlib.ExitStack() as stack:
            folder = Path(task["path"])
            if task["kind"] == "zip":
                private = tempfile.TemporaryDirectory(prefix="grader-zip-")   # mode 0700
                folder = Path(stack.enter_context(private))
                unpack_zip(Path(task["path"]), folder)
            result = grade_submission(folder, rubric=rubric, zygote=zygote, name=student,
                                      runner=runner)
        if not _zygote_alive(zygote):
            # Every call after the zygote died failed as a "crash": not the student's doing.
            raise SandboxError("the sandbox zygote stopped during grading")
    except ZipRejected as exc:
        result = failed_result(student, rubric, f"rejected zip: {exc}")
    except SubmissionError as exc:
        result = failed_result(student, rubric, str(exc))
    except Exception as exc:  # noqa: BLE001 - one student's failure must not stop the batch
        result = failed_result(student, rubric, f"{INTERNAL_ERROR}: {type(exc).__name__}: {exc}")
        fingerprint = None                       # not the student's doing: try again next run
        restart = isinstance(exc, SandboxError) or not _zygote_alive(zygote)
        restart_runner = isinstance(exc, RunnerError)
    write_student(out, student, result, fingerprint)
    return {"student": student, "status": result.status, "total": result.score,
            "seconds": time.monotonic() - started, "cpu_s": cpu_seconds(zygote) - cpu,
            "rss_mb": resident_mb(), "restart_zygote": restart,
            "restart_runner": restart_runner}


def _die_with_parent() -> None:
    """SIGKILL this process when its parent goes (also when it is SIGKILLed).

    The parent is the forkserver, which exits as soon as the batch process is gone.
    """
    parent = os.getppid()
    with contextlib.suppress(Exception):
        from grader.sandbox.jail import PR_SET_PDEATHSIG, prctl
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:          # it went before the signal was armed
        os._exit(1)


def _start_zygote(rubric: Rubric, slot: int):
    from grader.sandbox import Zygote
    forbidden = tuple(sorted({f for lab in rubric.labs.values() for f in lab.forbidden}))
    return Zygote(forbidden=forbidden, slot=slot).start()


def _start_runner(rubric: Rubric, zygote):
    """A started SuiteRunner with its call plan recorded (grader.call_plan) now, not in
    the first student's time."""
    from grader.call_plan import plan_for
    from grader.suite_runner import SuiteRunner

    runner = SuiteRunner(rubric=rubric).start()
    plan_for(runner=runner, labs=list(rubric.labs), zygote=zygote)
    return runner


def _grading_process(slot: int, conn, rubric: Rubric, out: Path) -> None:
    """A grading process: one zygote, then one student per message until told to stop."""
    _die_with_parent()
    import torch
    # One thread: N processes already fill N cores, and small ops run faster single-threaded.
    torch.set_num_threads(1)
    import grader.grading  # noqa: F401 - the engine (pytest, the plugin), once, up front

    try:
        zygote = _start_zygote(rubric, slot)
        # One pytest session for every student of this process: the suites are
        # configured, imported and collected once, not once per student.
        runner = _start_runner(rubric, zygote)
    except Exception as exc:  # noqa: BLE001 - reported to the batch, which stops
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    # Keep what is loaded now (torch, pytest, the engine) out of every later garbage
    # collection: with torch imported, a full collection walks ~200k objects.
    gc.collect()
    gc.freeze()
    conn.send(("ready",))
    try:
        while True:
            try:
                task = conn.recv()
            except EOFError:
                break
            if task is None:
                break
            reply = grade_task(task, rubric=rubric, out=out, zygote=zygote, runner=runner)
            if reply.pop("restart_runner"):
                runner.close()
                runner = _start_runner(rubric, zygote)
            if reply.pop("restart_zygote"):
                zygote.close()
                zygote = _start_zygote(rubric, slot)
            conn.send(("done", reply))
    finally:
        runner.close()
        zygote.close()


# ------------------------------------------------------------------------- the pool

@dataclass
class _Slot:
    index: int
    process: multiprocessing.Process
    conn: object
    ready: bool = False          # the process said it has started its zygote
    task: dict | None = None     # the student it is grading
    since: float = 0.0           # when it was started, or given its task


class BatchError(RuntimeError):
    """The batch itself cannot go on (e.g. no grading process could start)."""


class _Pool:
    """N grading processes, each given one student at a time; dead ones are replaced."""

    def __init__(self, *, jobs: int, rubric: Rubric, out: Path, budget_s: float, on_done):
        # forkserver, not fork: the batch process may have run torch ops (a forked OpenMP
        # pool deadlocks). The server imports torch and the engine once (no ops) and forks
        # every grading process from there, so a restart costs no second torch import.
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(["torch", "grader.grading"])
        self.rubric, self.out, self.budget_s, self.on_done = rubric, out, budget_s, on_done
        self.slots: dict[int, _Slot] = {}
        for index in range(jobs):       # started from the main thread (PDEATHSIG is per thread)
            self._start(index)

    def _start(self, index: int) -> None:
        ours, theirs = self.context.Pipe()
        process = self.context.Process(
            target=_grading_process, name=f"grader-batch-{index}",
            args=(index, theirs, self.rubric, self.out), daemon=True)
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
            write_student(self.out, student, failed_result(student, self.rubric, reason), None)
            self.on_done({"student": student, "status": reason, "total": 0.0,
                          "seconds": time.monotonic() - slot.since})
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

    def close(self) -> None:
        """Ask every process to finish, then stop any that has not."""
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


# ------------------------------------------------------------------------- progress

def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class Progress:
    """A rich progress bar on a terminal; plain 'graded i/n ... ETA' lines otherwise."""

    def __init__(self, *, total: int, enabled: bool, stream=None):
        self.total, self.enabled = total, enabled and total > 0
        self.stream = stream or sys.stdout
        self.done = self.failed = 0
        self.started = time.monotonic()
        self.last_line = 0.0
        self.recent: deque = deque(maxlen=ETA_WINDOW)    # when the latest students finished
        self.bar = None
        if self.enabled and self.stream.isatty():
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                       TextColumn, TimeElapsedColumn, TimeRemainingColumn)
            self.bar = RichProgress(TextColumn("grading"), BarColumn(), MofNCompleteColumn(),
                                    TextColumn("{task.fields[failed]}"), TimeElapsedColumn(),
                                    TextColumn("ETA"), TimeRemainingColumn())
            self.bar.start()
            self.task = self.bar.add_task("grading", total=total, failed="")

    def advance(self, reply: dict) -> None:
        self.done += 1
        self.failed += reply.get("status") != "ok"
        if not self.enabled:
            return
        failed = f"{self.failed} not ok" if self.failed else ""
        if self.bar is not None:
            self.bar.update(self.task, advance=1, failed=failed)
            return
        now = time.monotonic()
        self.recent.append(now)
        step = max(1, self.total // 20)
        if self.done == self.total or self.done % step == 0 or now - self.last_line > 30:
            self.last_line = now
            # The pace of the latest ETA_WINDOW students: once they are all past the
            # start-up, neither it nor the rejected zips (written at once) skew it.
            span = self.recent[-1] - self.recent[0]
            left = self.total - self.done
            if not left:
                eta = "0s"
            elif len(self.recent) > 1 and span > 0:
                eta = _duration(span / (len(self.recent) - 1) * left)
            else:
                eta = "?"
            print(f"graded {self.done}/{self.total}" + (f" ({failed})" if failed else "")
                  + f"  elapsed {_duration(now - self.started)}  ETA {eta}",
                  file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


# ------------------------------------------------------------------------- the API

@dataclass
class BatchSummary:
    root: str
    out: str
    students: int                # rows in grades.csv
    graded: int                  # graded in this run
    up_to_date: int              # skipped: unchanged since their last grading
    not_ok: int                  # rows whose status is not "ok"
    internal_errors: int         # of those, the grader's fault (tried again on the next run)
    jobs: int
    seconds: float               # wall-clock, this run
    cpu_seconds: float           # grading processes, zygotes and workers, this run
    max_rss_mb: float            # the largest resident size of a grading process
    max_total: float
    mean: float | None
    median: float | None
    min: float | None
    max: float | None
    files: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _as_rubric(rubric) -> Rubric:
    if rubric is None:
        return load_rubric(paths.RUBRIC)
    if isinstance(rubric, Rubric):
        return rubric
    return load_rubric(Path(rubric))


def grade_batch(root: str | Path, *, out: str | Path, jobs: int | None = None,
                rubric: Rubric | str | Path | None = None,
                progress: bool = True) -> BatchSummary:
    """Grade every student in ``root`` into ``out`` (see the module docstring)."""
    from grader.cli import UsageError

    started = time.monotonic()
    root, out = Path(root).resolve(), Path(out).resolve()
    if not root.is_dir():
        raise UsageError(f"{root}: not a folder of submissions (one entry per student)")
    jobs = (os.cpu_count() or 1) if jobs is None else jobs
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {jobs}")
    rubric = _as_rubric(rubric)
    out.mkdir(parents=True, exist_ok=True)
    entries = list_students(root, out=out)
    course = course_digests(rubric)

    tasks: deque = deque()
    instant: list[tuple[Entry, dict]] = []
    up_to_date = 0
    for entry in entries:
        fingerprint = {"submission": submission_digest(entry), **course}
        if is_up_to_date(out / entry.student, fingerprint):
            up_to_date += 1
            continue
        if entry.kind == "zip" and not entry.problem:
            try:
                check_zip(entry.path)
            except ZipRejected as exc:
                entry = Entry(entry.student, entry.path, entry.kind, f"rejected zip: {exc}")
        if entry.problem:
            instant.append((entry, fingerprint))
        else:
            tasks.append({"student": entry.student, "path": str(entry.path),
                          "kind": entry.kind, "fingerprint": fingerprint})

    jobs = min(jobs, len(tasks))          # 0 when nothing needs a grading process
    if progress:
        print(f"{len(entries)} students in {root}: {up_to_date} up to date, "
              f"{len(tasks) + len(instant)} to grade"
              + (f" with {jobs} process(es)" if jobs else ""), flush=True)
    report = Progress(total=len(tasks) + len(instant), enabled=progress)
    internal_errors, cpu, rss = 0, 0.0, 0.0

    def done(reply: dict) -> None:
        nonlocal internal_errors, cpu, rss
        internal_errors += str(reply["status"]).startswith(INTERNAL_ERROR)
        cpu += reply.get("cpu_s", 0.0)
        rss = max(rss, reply.get("rss_mb", 0.0))
        report.advance(reply)

    try:
        for entry, fingerprint in instant:
            write_student(out, entry.student,
                          failed_result(entry.student, rubric, entry.problem), fingerprint)
            done({"student": entry.student, "status": entry.problem})
        if tasks:
            pool = _Pool(jobs=jobs, rubric=rubric, out=out, budget_s=student_budget_s(rubric),
                         on_done=done)
            try:
                pool.run(tasks)
            finally:
                pool.close()
    finally:
        report.close()

    for stale in out.glob(".*.*"):                # temp files of a gradebook write that was killed
        if any(stale.name.startswith(f".{name}.") for name in GRADEBOOK_FILES):
            with contextlib.suppress(OSError):
                stale.unlink()
    book = build_gradebook(out=out, students=[e.student for e in entries], rubric=rubric)
    score = book.summary["score"]
    return BatchSummary(
        root=str(root), out=str(out), students=book.rows, graded=report.done,
        up_to_date=up_to_date, not_ok=book.not_ok, internal_errors=internal_errors,
        jobs=jobs, seconds=round(time.monotonic() - started, 3),
        cpu_seconds=round(cpu, 3), max_rss_mb=round(rss, 1),
        max_total=book.summary["max_total"], mean=score["mean"], median=score["median"],
        min=score["min"], max=score["max"], files={k: str(v) for k, v in book.files.items()})


# ------------------------------------------------------------------------- the CLI

def _positive_int(text: str) -> int:
    import argparse
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def cmd_batch(args) -> int:
    summary = grade_batch(args.root, out=args.out, jobs=args.jobs,
                          rubric=args.batch_rubric or args.rubric, progress=not args.quiet)
    if not args.quiet:
        print(f"{summary.students} students ({summary.graded} graded now, "
              f"{summary.up_to_date} up to date) in {_duration(summary.seconds)}"
              + (f"; {summary.not_ok} could not be graded" if summary.not_ok else ""))
        if summary.mean is not None:
            print(f"total: mean {summary.mean:g}, median {summary.median:g}, "
                  f"min {summary.min:g}, max {summary.max:g} (out of {summary.max_total:g})")
        print(f"Wrote {summary.files['grades_csv']}, {Path(summary.files['summary_json']).name}"
              " and the plots")
    if summary.internal_errors:
        print(f"{summary.internal_errors} student(s) hit a grader error; run the batch again "
              "to retry them", file=sys.stderr)
        return 1
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "batch", help="grade a whole class in parallel (resumable): grades.csv, summary, plots")
    p.add_argument("root", help="folder with one entry per student: a folder of lab files "
                                "or a .zip of one (the name is the student id)")
    p.add_argument("--out", required=True, help="output folder (rerun with the same folder "
                                                "to resume; unchanged students are skipped)")
    p.add_argument("--jobs", type=_positive_int, default=None,
                   help=f"grading processes (default: the number of CPUs, {os.cpu_count()})")
    p.add_argument("--rubric", dest="batch_rubric",
                   help="rubric file (default: the course's rubric.yaml)")
    p.add_argument("--quiet", action="store_true", help="no progress or summary lines")
    p.set_defaults(func=cmd_batch)
