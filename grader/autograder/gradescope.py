"""The Gradescope runner: grade /autograder/submission into /autograder/results/results.json.

``run_autograder`` (the zip's entry point) starts ``python -m grader.autograder.gradescope``.
Whatever happens, a valid results.json is on disk:

1. before anything heavy is imported, a fallback (score 0, saying grading did not finish);
2. once the rubric is read, every test listed as "not graded yet" (still score 0);
3. after each lab, that lab's real results (an atomic rename each time);
4. a watchdog writes what it has shortly before Gradescope's time limit and ends the run, so
   a submission that hangs still gets the credit of the labs that finished.

Student code runs only in sandbox workers; a preflight checks that they run as an
unprivileged user and cannot see the autograder's source (hidden tests, solutions) before
any submission code is imported. Strings in the JSON come from the engine (capped,
visibility-filtered) and are made printable here; ``json.dumps`` escapes the rest.

Configuration: ``<source>/autograder.json`` (written by ``grader gradescope``), overridden
by environment variables, all optional:

- ``AUTOGRADER_ROOT``: the Gradescope folder (default ``/autograder``);
- ``AUTOGRADER_LABS``: comma-separated labs to grade (default: the zip's, else all);
- ``AUTOGRADER_TIMEOUT_S``: the assignment's Gradescope timeout (default 600);
- ``AUTOGRADER_WORKER_MEMORY_MB``: address space a worker may add (default 256);
- ``AUTOGRADER_SANDBOX_MODE``: ``auto`` (default), ``root``, ``userns`` or ``plain``; whatever
  the mode, grading stops if a worker runs as root or can see the source folder.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from grader.outputs.atomic import atomic_write_text
from grader.outputs.gradescope import gradescope_payload
from grader.outputs.text import printable
from grader.results import OK, Fault, LabResult, LabStatus, SubmissionResult, TestResult
from grader.errors import ConfigError

DEFAULT_ROOT = Path("/autograder")
DEFAULT_TIMEOUT_S = 600.0          # Gradescope's default overall timeout (10 minutes)
DEFAULT_WORKER_MEMORY_MB = 256     # what a worker may map on top of the torch-loaded zygote
CONFIG_FILE = "autograder.json"
SANDBOX_MODES = ("auto", "root", "userns", "plain")  # the preflight has the last word

STAFF_PROBLEM = ("This is a problem with the autograder, not with your code; please tell "
                 "the course staff.")


@dataclass
class RunnerConfig:
    root: Path = DEFAULT_ROOT
    labs: list[str] | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    worker_memory_mb: int = DEFAULT_WORKER_MEMORY_MB
    sandbox_mode: str = "auto"

    @property
    def source(self) -> Path:
        return self.root / "source"

    @property
    def submission(self) -> Path:
        return self.root / "submission"

    @property
    def results(self) -> Path:
        return self.root / "results" / "results.json"

    @property
    def budget_s(self) -> float:
        """Seconds we allow ourselves: the timeout less a margin for start-up and writing."""
        margin = max(15.0, 0.1 * self.timeout_s)
        return max(5.0, self.timeout_s - margin)

    @classmethod
    def load(cls, environ=os.environ) -> "RunnerConfig":
        """autograder.json under the source folder, then AUTOGRADER_* variables on top."""
        root = Path(environ.get("AUTOGRADER_ROOT") or DEFAULT_ROOT)
        settings: dict = {}
        config_path = root / "source" / CONFIG_FILE
        if config_path.is_file():
            try:
                settings = json.loads(config_path.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise ConfigError(f"{config_path}: not valid JSON: {exc}") from None
            if not isinstance(settings, dict):
                raise ConfigError(f"{config_path}: must hold a JSON object")
        for key, var in (("labs", "AUTOGRADER_LABS"), ("timeout_s", "AUTOGRADER_TIMEOUT_S"),
                         ("worker_memory_mb", "AUTOGRADER_WORKER_MEMORY_MB"),
                         ("sandbox_mode", "AUTOGRADER_SANDBOX_MODE")):
            if environ.get(var):
                value = environ[var]
                settings[key] = [s.strip() for s in value.split(",") if s.strip()] \
                    if key == "labs" else value
        try:
            config = cls(root=root,
                         labs=list(settings["labs"]) if settings.get("labs") else None,
                         timeout_s=float(settings.get("timeout_s", DEFAULT_TIMEOUT_S)),
                         worker_memory_mb=int(settings.get("worker_memory_mb",
                                                           DEFAULT_WORKER_MEMORY_MB)),
                         sandbox_mode=str(settings.get("sandbox_mode", "auto")))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"bad autograder setting: {exc}") from None
        if config.sandbox_mode not in SANDBOX_MODES:
            raise ConfigError(f"sandbox mode {config.sandbox_mode!r} is not one of "
                              f"{', '.join(SANDBOX_MODES)}")
        if config.timeout_s <= 0 or config.worker_memory_mb <= 0:
            raise ConfigError("the timeout and the worker memory must be positive")
        return config


_log = None


def say(message: str) -> None:
    """A line for the instructor's view of the run (Gradescope shows stdout to staff only).

    Written, unbuffered, to a copy of the original stdout: while the suites run, pytest
    captures file descriptor 1, and the watchdog ends the process with os._exit.
    """
    global _log
    if _log is None:
        _log = os.fdopen(os.dup(sys.__stdout__.fileno()), "w", buffering=1, encoding="utf-8",
                         errors="replace")
    _log.write(message + "\n")
    _log.flush()


# --------------------------------------------------------------------------------------
# Writing results.json
# --------------------------------------------------------------------------------------


def _clean(value):
    """Every string made printable (the engine already capped and filtered them)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


def write_results(path: Path, payload: dict) -> None:
    """Atomically replace results.json (ASCII JSON: every other character escaped)."""
    atomic_write_text(path, json.dumps(_clean(payload), indent=2, ensure_ascii=True) + "\n")


def fallback_payload(message: str) -> dict:
    """A valid results.json with no tests: what Gradescope gets if nothing better is written."""
    return {"score": 0.0, "execution_time": 0.0, "output": message, "output_format": "text",
            "visibility": "visible", "stdout_visibility": "hidden", "tests": [],
            "extra_data": {"status": "not graded", "fault": Fault.GRADER}}


def pending_result(rubric, labs: list[str], message: str) -> SubmissionResult:
    """Every test of ``labs`` listed as failed with ``message`` (nothing graded yet: until a
    lab's real results replace it, the lab is the grader's to finish, never the student's)."""
    result = SubmissionResult(submission="submission", status="not finished", fault=Fault.GRADER)
    for lab in labs:
        spec = rubric.labs[lab]
        lab_result = LabResult(name=lab, title=spec.title, file=spec.file,
                               status=LabStatus.ERROR, message=message, fault=Fault.GRADER)
        for name, t in spec.tests.items():
            lab_result.tests.append(TestResult(lab=lab, name=name, description="",
                                               visibility=t.visibility, max_score=t.points,
                                               passed=False, message=message))
        result.labs.append(lab_result)
    return result


class PartialResults:
    """The results so far, rewritten to disk after every lab; thread-safe for the watchdog."""

    def __init__(self, path: Path, result: SubmissionResult, started: float):
        self.path, self.result, self.started = path, result, started
        self.lock = threading.Lock()
        self.finished = False
        self.done: set[str] = set()     # labs whose real results are in
        self.failed = False             # ``fail`` was called: the final file is not "ok"

    def write(self) -> None:
        self.result.execution_time = time.monotonic() - self.started
        write_results(self.path, gradescope_payload(self.result))

    def replace_lab(self, lab_result: LabResult) -> None:
        with self.lock:
            if self.finished:
                return
            self.result.labs = [lab_result if lab.name == lab_result.name else lab
                                for lab in self.result.labs]
            self.done.add(lab_result.name)
            self.write()

    def add_notes(self, notes: list[str]) -> None:
        """Notes about the submission (a file found in a subfolder...), each once."""
        with self.lock:
            self.result.notes.extend(n for n in notes if n not in self.result.notes)

    def fail(self, status: str, fault: Fault) -> None:
        """Record that the run is not (all) graded: ``status`` for people, ``fault`` whose."""
        self.result.status, self.result.fault = status, fault
        self.failed = True

    def finish(self) -> bool:
        """Write the final file (graded, unless ``fail`` said otherwise); False if the watchdog
        already ended the run."""
        with self.lock:
            if self.finished:
                return False
            self.finished = True
            if not self.failed:
                self.result.status, self.result.fault = OK, None
            self.write()
            return True

    def fail_pending(self, message: str, *, status: str, fault: Fault, note: str = "") -> bool:
        """Final write: every lab not graded yet gets ``message`` (and ``fault``: whose doing
        it is); False if already final."""
        with self.lock:
            if self.finished:
                return False
            self.finished = True
            for lab in self.result.labs:
                if lab.name not in self.done:
                    lab.message, lab.fault = message, fault
                    for t in lab.tests:
                        t.message = message
            self.result.status, self.result.fault = status, fault
            if note:
                self.result.notes.append(note)
            self.write()
            return True

    def time_out(self, budget_s: float) -> bool:
        """Mark the labs not yet graded as cut short by time; False if already final."""
        return self.fail_pending(
            f"Not graded: the autograder stopped after {budget_s:.0f} s, before it finished "
            "this lab (its tests ran too long: an infinite loop or very slow code here or in "
            "a lab it imports). Labs that finished kept their points.",
            status="timed out", fault=Fault.PLATFORM,
            note=f"Grading was cut short after {budget_s:.0f} s; the score counts only the "
                 "labs that finished.")


def _protect_from_oom() -> None:
    """Make the grading process the OOM killer's last choice (root only; best effort).

    Done after the zygote started, so the zygote and the workers keep the default score and
    a memory-hungry submission is what the kernel kills, not the process writing results.
    """
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("-900")
    except OSError:
        pass


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


def run(config: RunnerConfig) -> int:
    """Grade the submission under ``config.root``; 0 when the results are the real ones."""
    started = time.monotonic()
    say(f"grading {config.submission} (labs: {', '.join(config.labs or ['all'])}; "
        f"time budget {config.budget_s:.0f} s of {config.timeout_s:.0f} s)")
    write_results(config.results, fallback_payload(
        "The autograder did not finish, so nothing was graded. " + STAFF_PROBLEM))

    from grader.course import Course
    from grader.errors import RubricError, SubmissionError
    from grader.outputs.atomic import use_output_mode

    # The course is the bundle's source folder, named by the config: never the environment.
    course = Course(config.source)
    try:
        rubric = course.rubric          # parsed, and checked against the suites, once
        use_output_mode(course.output_mode)
        labs = config.labs or list(rubric.labs)
        unknown = [lab for lab in labs if lab not in rubric.labs]
        if unknown:
            raise ConfigError(f"unknown lab(s) {', '.join(unknown)}; the rubric has "
                              f"{', '.join(rubric.labs)}")
    except (RubricError, ConfigError) as exc:
        say(f"autograder configuration error: {exc}")
        write_results(config.results, fallback_payload(
            "The autograder is misconfigured, so nothing was graded. " + STAFF_PROBLEM))
        return 1

    partial = PartialResults(config.results, pending_result(
        rubric, labs, "Not graded: the autograder stopped (time or memory limit) before it "
                      "reached this lab."), started)
    partial.write()

    from grader.grading import Grader, retry_with_a_fresh_grader
    from grader.sandbox import Limits

    def new_grader() -> Grader:
        return Grader(course, sandbox_mode=config.sandbox_mode,
                      limits=Limits(memory_mb=config.worker_memory_mb))

    grader = new_grader()

    def watchdog() -> None:
        if partial.time_out(config.budget_s):
            say(f"watchdog: {config.budget_s:.0f} s budget spent; wrote partial results")
            try:
                grader.close(wait=False)    # a test may be hanging: do not wait for it
            finally:
                os._exit(0)

    timer = threading.Timer(max(0.0, config.budget_s - (time.monotonic() - started)), watchdog)
    timer.daemon = True
    timer.start()
    try:
        grader.start()
        _protect_from_oom()
        problem = grader.isolation_problem([config.source, course.rubric_path,
                                            course.solutions])
        if problem:
            say(f"sandbox preflight failed: {problem}")
            partial.fail_pending("Not graded: the autograder could not isolate student code. "
                                 + STAFF_PROBLEM, status=f"sandbox error: {problem}",
                                 fault=Fault.PLATFORM)
            return 1
        # One lab at a time, through the same Grader as every other route, so that each
        # finished lab's results are on disk before the next starts (the watchdog keeps them).
        for lab in labs:
            # A fault of the grader's own is tried once more with a fresh Grader, as a
            # batch does for a student (``retry_with_a_fresh_grader``).
            graded, grader = retry_with_a_fresh_grader(
                grader, lambda: new_grader().start(),
                lambda g, lab=lab: _grade_lab(g, config.submission, lab),
                lambda outcome: isinstance(outcome, str))
            if isinstance(graded, SubmissionError):
                say(f"no submission to grade: {graded}")
                partial.fail_pending(f"Not graded: {graded}", status="no submission",
                                     fault=Fault.STUDENT)
                return 1
            if isinstance(graded, str):     # the grader failed twice: one lab, not the rest
                say(f"{lab}: the grader failed:\n{graded}")
                partial.replace_lab(pending_result(
                    rubric, [lab], "Not graded: the grader failed on this lab. "
                    + STAFF_PROBLEM).labs[0])
                partial.fail(f"grader error in {lab}", Fault.GRADER)
                continue
            lab_result = graded.labs[0]
            say(f"{lab}: {lab_result.score:g}/{lab_result.max_score:g} "
                f"({lab_result.status}) in {graded.execution_time:.1f} s")
            partial.add_notes(graded.notes)
            partial.replace_lab(lab_result)
            if graded.fault is not None:
                partial.fail(graded.status, graded.fault)
        partial.finish()
    except Exception:  # noqa: BLE001 - the sandbox or the grader itself broke: say so, keep a file
        say(f"the autograder failed:\n{traceback.format_exc()}")
        partial.fail_pending("Not graded: the autograder failed. " + STAFF_PROBLEM,
                             status="grader error", fault=Fault.GRADER)
        return 1
    finally:
        timer.cancel()
        grader.close()
    result = partial.result
    say(f"total: {result.score:g}/{result.max_score:g} in {result.execution_time:.1f} s; "
        f"wrote {config.results}")
    return 0


def _grade_lab(grader, submission: Path, lab: str):
    """One lab's ``SubmissionResult``; the ``SubmissionError`` that stops the run (no
    submission); or, for a failure of the grader's own, its traceback as text."""
    from grader.errors import SubmissionError

    try:
        return grader.grade(submission, labs=[lab], name="submission")
    except SubmissionError as exc:
        return exc
    except Exception:  # noqa: BLE001 - one lab's grader failure must not lose the rest
        return traceback.format_exc()


def main() -> int:
    # The environment is read before torch is: fall back to a results.json at once on error.
    try:
        config = RunnerConfig.load()
    except ConfigError as exc:
        root = Path(os.environ.get("AUTOGRADER_ROOT") or DEFAULT_ROOT)
        say(f"autograder configuration error: {exc}")
        write_results(root / "results" / "results.json", fallback_payload(
            "The autograder is misconfigured, so nothing was graded. " + STAFF_PROBLEM))
        return 1
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
