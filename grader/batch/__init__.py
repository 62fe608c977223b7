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
  (``Zygote(slot=i)``, held while it lives, so no two zygotes on the machine share a uid). It grades with
  ``grading.Grader``, the engine of ``grader grade``, and writes ``results.json`` and then
  ``fingerprint.json``, both atomically, before it reports back a one-line status. Results
  are never collected in memory.
- A grading process that dies or overruns the student's time budget is killed and
  replaced; that student's status says what happened, and nobody else is affected.
- At the end the gradebook (grades.csv, summary.json, plots) is rebuilt from every
  student's results.json (``grader.outputs.gradebook``), so a batch killed at any moment and run
  again ends with the same gradebook as an uninterrupted run.
- ``labs``: grade only these labs (one lab a week); results, grades.csv and the summary
  are then out of those labs' points, and the fingerprint holds the selection, so a rerun
  with other labs grades everyone again.
- ``scheduler``: the same batch on a Dask cluster (``grader.batch.cluster``, imported only
  then): the students go to the cluster's workers instead of local grading processes;
  everything else here is the same.
- At the end, with the gradebook, the similarity report (``grader.batch.integrity``:
  similarity.json and similarity.csv; ``similar_to``: folders of past or public solutions
  each student is compared with, as with the course's solutions): for the instructor's
  eyes in class.html, never a grade change, and nothing of it in any student's files.
- Ctrl-C stops every grading process and raises ``BatchInterrupted`` (a
  KeyboardInterrupt) saying how many students are graded; a rerun resumes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grader.batch import integrity
from grader.batch.fingerprints import course_digests, is_up_to_date, submission_digest
from grader.batch.pool import Pool, student_budget_s, write_student
from grader.batch.progress import Progress
from grader.batch.students import Entry, list_students
from grader.course import Course
from grader.errors import UsageError, ZipRejected
from grader.intake.zips import check_zip
from grader.outputs.atomic import use_output_mode
from grader.outputs.gradebook import GRADEBOOK_FILES, build_gradebook, failed_result
from grader.results import Fault

__all__ = ["BatchInterrupted", "BatchSummary", "grade_batch"]


class BatchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a batch; ``str()`` says how far it got (``grader batch`` prints it)."""


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
    # Of it, by lab (each lab's import probe, its tests and their workers), and outside any
    # lab (sanitizing, scoring, writing the files, workers' exits): they add up to it.
    cpu_seconds_by_lab: dict[str, float]
    cpu_seconds_outside_labs: float
    max_rss_mb: float            # the largest resident size of a grading process
    max_total: float
    mean: float | None
    median: float | None
    min: float | None
    max: float | None
    files: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def grade_batch(root: str | Path, *, out: str | Path, course: Course, jobs: int | None = None,
                progress: bool = True, labs: list[str] | None = None,
                scheduler: str | None = None, worker_course: str | Path | None = None,
                similar_to: list[str | Path] | None = None) -> BatchSummary:
    """Grade every student in ``root`` into ``out`` (see the module docstring); ``labs``:
    only these labs (default: all), scored out of their points alone; ``scheduler``: on
    the Dask cluster at this address (``jobs`` is then ignored), whose workers find the
    course in ``worker_course`` (default: the same folder as here); ``similar_to``: folders
    of past or public solutions for the similarity report. ``course``: the course (its
    rubric, suites, solutions, secret and output mode)."""
    started = time.monotonic()
    root, out = Path(root).resolve(), Path(out).resolve()
    if not root.is_dir():
        raise UsageError(f"{root}: not a folder of submissions (one entry per student)")
    jobs = (os.cpu_count() or 1) if jobs is None else jobs
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1, not {jobs}")
    similar_to = [Path(d).resolve() for d in similar_to or []]
    for folder in similar_to:
        if not folder.is_dir():
            raise UsageError(f"--similar-to {folder}: not a folder (of past or public solutions)")
    rubric = course.rubric          # checked against the suites, before anyone is graded
    try:
        scored = rubric.only(labs)          # what every total is out of
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    labs = list(scored.labs)
    use_output_mode(course.output_mode)
    out.mkdir(parents=True, exist_ok=True)
    entries = list_students(root, out=out)
    digests = {**course_digests(rubric, course.secret), "labs": labs}

    tasks: deque = deque()
    instant: list[tuple[Entry, dict]] = []
    up_to_date = 0
    for entry in entries:
        fingerprint = {"submission": submission_digest(entry), **digests}
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
              + (f" on the Dask cluster at {scheduler}" if scheduler and tasks
                 else f" with {jobs} process(es)" if jobs else ""), flush=True)
    report = Progress(total=len(tasks) + len(instant), enabled=progress)
    internal_errors, cpu, rss, outside = 0, 0.0, 0.0, 0.0
    cpu_by_lab = dict.fromkeys(labs, 0.0)

    def done(reply: dict) -> None:
        nonlocal internal_errors, cpu, rss, outside
        internal_errors += reply.get("fault") == Fault.GRADER
        cpu += reply.get("cpu_s", 0.0)
        outside += reply.get("cpu_outside_labs_s", 0.0)
        for lab, seconds in reply.get("cpu_by_lab_s", {}).items():
            cpu_by_lab[lab] = cpu_by_lab.get(lab, 0.0) + seconds
        rss = max(rss, reply.get("rss_mb", 0.0))
        report.advance(reply)

    pool = None
    try:
        for entry, fingerprint in instant:
            write_student(out, entry.student,
                          failed_result(entry.student, scored, entry.problem, Fault.STUDENT),
                          fingerprint)
            done({"student": entry.student, "status": entry.problem, "fault": Fault.STUDENT})
        if tasks:
            how = {"course": course, "out": out, "budget_s": student_budget_s(scored),
                   "on_done": done, "labs": None if scored is rubric else labs}
            if scheduler:
                pool = _cluster_pool(scheduler, how, worker_course)
                jobs = pool.workers
            else:
                pool = Pool(jobs=jobs, **how)
            pool.run(tasks)
    except KeyboardInterrupt:
        with _no_ctrl_c():                # a second Ctrl-C must not cut the cleanup short
            if pool is not None:
                pool.close(wait=False)    # every grading process, by its pid
            report.close()
        raise BatchInterrupted(f"{up_to_date + report.done} of {len(entries)} students graded; "
                               f"run the same command again to resume") from None
    finally:
        if pool is not None:
            pool.close()
        report.close()

    for stale in out.glob(".*.*"):                # temp files of a gradebook write that was killed
        if any(stale.name.startswith(f".{name}.") for name in GRADEBOOK_FILES):
            with contextlib.suppress(OSError):
                stale.unlink()
    similarity = integrity.class_report(entries, course, labs, similar_to=similar_to,
                                        jobs=os.cpu_count() or 1)
    similarity_files = integrity.write_report(similarity, out)
    book = build_gradebook(out=out, students=[e.student for e in entries], rubric=scored,
                           similarity=similarity)
    book.files.update(similarity_files)
    score = book.summary["score"]
    return BatchSummary(
        root=str(root), out=str(out), students=book.rows, graded=report.done,
        up_to_date=up_to_date, not_ok=book.not_ok, internal_errors=internal_errors,
        jobs=jobs, seconds=round(time.monotonic() - started, 3),
        cpu_seconds=round(cpu, 3),
        cpu_seconds_by_lab={lab: round(s, 3) for lab, s in cpu_by_lab.items()},
        cpu_seconds_outside_labs=round(outside, 3), max_rss_mb=round(rss, 1),
        max_total=book.summary["max_total"], mean=score["mean"], median=score["median"],
        min=score["min"], max=score["max"], files={k: str(v) for k, v in book.files.items()})


def _cluster_pool(scheduler: str, how: dict, worker_course: str | Path | None):
    """The Dask cluster's stand-in for ``Pool`` (dask is imported only here)."""
    try:
        from grader.batch.cluster import ClusterPool
    except ImportError as exc:
        raise UsageError(f"--scheduler needs dask and distributed ({exc}): pip install "
                         "'attention-labs[cluster]'") from None
    return ClusterPool(scheduler=scheduler, worker_course=worker_course, **how)


@contextlib.contextmanager
def _no_ctrl_c():
    """Ctrl-C ignored while an interrupted batch stops its processes (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
