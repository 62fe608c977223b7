"""The Grader: the one way to grade a submission (sanitize, run, collect, score).

Every route goes through it: ``grader check``/``grade``/``feedback``, ``grader validate``,
each grading process of ``grader batch``, the Gradescope runner and the notebook kernel's
``check``. A ``Grader`` owns a sandbox zygote (student code runs only in its workers), one
long-lived pytest session per visibility (``engine.suite_runner``) and, when asked to send
calls ahead, the call plans (``engine.call_plan``). Its steps:

1. sanitize (``grader.intake``): only the rubric's lab files cross, as clean sources, into a
   private scratch folder; each lab that cannot be graded gets a typed ``Problem``;
2. run: each lab is imported in a sandbox worker (the contract's names probed), then the
   lab's suites run under pytest with the grading plugin;
3. collect + score: one ``TestResult`` per rubric test, points from the rubric only.

A fault of the grader's own (the zygote gone, the pytest session stopped) raises a
``GraderFault``: it is never scored as the student's failure.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import gc
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar

from grader.course import Course
from grader.errors import (GradingIncomplete, NeedsJail, SandboxError, SubmissionError,
                           ZipRejected)
from grader.intake import Problem, Sanitized, sanitize
from grader.intake.zips import unpack_zip
from grader.outputs.text import capped
from grader.results import Fault, LabResult, LabStatus, SubmissionResult, TestResult
from grader.rubric import Rubric
from grader.sandbox import Limits, Zygote, make_scratch
from grader.sandbox.backends import backend_of, new_zygote

from grader.engine.lab_clock import OUTSIDE, LabClock

if TYPE_CHECKING:   # torch and pytest: imported by ``load_engine`` (see Grader.start)
    from grader.engine.call_plan import CallPlan
    from grader.engine.suite_runner import SuiteRunner

VISIBILITIES = ("public", "hidden")
TEST_TEXT_CAP = 2048        # characters of a test's message (and of its diagnosis, of a note)
MAX_NOTES = 16              # notes about a submission (a file found elsewhere, cells left out)


T = TypeVar("T")     # what one attempt gives (``retry_with_a_fresh_grader``)


class Grader:
    """Grades submissions of ``course`` (its rubric, suites, solutions and secret: a
    ``grader.course.Course``, its rubric checked against the suites once); use as a
    context manager (or ``close``).

    ``visibility``: the suites graded by default (``("public",)`` for a student's check).
    ``send_ahead``: send each test's first call to its worker ahead of the test
    (``engine.call_plan``); the plan is recorded once per Grader from the reference
    solutions, which pays off over many submissions (a batch), not one.
    ``slot``, ``sandbox_mode``, ``limits``: the sandbox's (see ``grader.sandbox``).
    ``zygote``: a started zygote to share (tests); the caller keeps and closes it.
    ``secret``: the course secret hidden inputs derive from (default: the course's, read or
    made on first use, when hidden suites are graded; ``grader.secret``).
    ``graded``: a graded run (default: when hidden suites are graded; nbgrader says True
    for a lab without any): public tests draw inputs from the course secret and the
    submission, and show the student's own text only capped and stripped (issue #44).
    ``many_workers``: the zygote prepares its heap for many forks (``Zygote.many_workers``:
    cheaper workers for 0.2-1.5 s more at start); ``grade_submission``, one submission,
    says False.
    """

    def __init__(self, course: Course, *,
                 visibility: tuple[str, ...] = VISIBILITIES, send_ahead: bool = False,
                 slot: int = 0, sandbox_mode: str = "auto", limits: Limits | None = None,
                 zygote: Zygote | None = None, secret: bytes | None = None,
                 many_workers: bool = True, graded: bool | None = None):
        if not isinstance(course, Course):
            raise TypeError(f"Grader needs a grader.course.Course, not {type(course).__name__}")
        self.course = course
        # Checked against the suites (once per Course) before anyone is graded.
        self.rubric = course.rubric
        self.visibility = tuple(visibility)
        self.send_ahead = send_ahead
        # A graded run (anything but a student's own check) draws public inputs of its own
        # and shows public tests the student's text only stripped (issue #44).
        self.graded = "hidden" in self.visibility if graded is None else graded
        self._secret = secret
        self._owns_zygote = zygote is None
        # The jail, or the portable backend where the jail cannot run or is forced off
        # (``grader.sandbox.backends``): the same interface either way.
        self._zygote = zygote or new_zygote(forbidden=self.rubric.all_forbidden, slot=slot,
                                            mode=sandbox_mode, limits=limits or Limits(),
                                            many_workers=many_workers,
                                            hide=course.private_paths)
        if self.graded and not backend_of(self._zygote).grades_for_points:
            # Points are given only where the jail isolates and measures (every graded run:
            # grade, batch, Gradescope, Classroom, nbgrader, hidden tests or not).
            self._zygote.close()
            raise NeedsJail("grading for points needs the Linux sandbox (this machine runs "
                            "the portable one); `grader check` runs the public tests here")
        self._runners: dict[tuple[str, ...], SuiteRunner] = {}
        self._plans: dict[tuple, CallPlan | None] = {}
        self._reference_scratch = None      # see _reference_dir

    # -- life cycle -----------------------------------------------------------------------
    def start(self, *, suites: bool = False) -> "Grader":
        """Start the sandbox now (else the first ``grade`` does); SandboxError if it cannot.

        The zygote is launched first, and this process imports torch and the engine
        (``load_engine``) while the zygote imports its own: two processes, two cores, one
        wait instead of two. ``suites``: also start the pytest session for the Grader's
        visibility (its collection, on its own thread, overlaps the zygote's start too).
        """
        if self._owns_zygote and not self._zygote.alive:
            self._zygote.launch()
        load_engine()
        if suites:
            self._runner(self.visibility)
        if self._owns_zygote:
            self._zygote.start()            # waits for the zygote's hello, if not had yet
        return self

    def prepare(self, labs: list[str] | None = None) -> "Grader":
        """Start the sandbox and the pytest session and, when sending calls ahead, record
        the plan for ``labs`` (default: every lab) now (a batch's grading process does this
        before its first student, so no student's time pays for it)."""
        self.start(suites=True)
        if self.send_ahead:
            self.call_plan(list(labs or self.rubric.labs), self.visibility)
        return self

    @property
    def alive(self) -> bool:
        """Whether the sandbox can still fork workers (False once its zygote has ended)."""
        return self._zygote.alive

    @property
    def secret(self) -> bytes:
        """The course secret (read, or made, on first use)."""
        if self._secret is None:
            self._secret = self.course.secret
        return self._secret

    @property
    def sandbox_mode(self) -> str:
        return self._zygote.mode

    @property
    def sandbox_pid(self) -> int | None:
        """The zygote's process id (its CPU time includes the workers it reaped)."""
        return self._zygote.pid

    def close(self, *, wait: bool = True) -> None:
        """End the pytest sessions (``wait`` for them: pytest is not made to run two
        sessions at once in one process) and the sandbox, if this Grader started it."""
        for runner in self._runners.values():
            runner.close(wait=wait)
        self._runners.clear()
        if self._owns_zygote:
            self._zygote.close()
        if self._reference_scratch is not None:
            self._reference_scratch.cleanup()
            self._reference_scratch = None

    def __enter__(self) -> "Grader":
        return self.start()

    def __exit__(self, exc_type, *exc) -> None:
        # Leaving on an error (Ctrl-C, say): do not wait for tests still running; the
        # pytest threads are daemons and end with the process.
        self.close(wait=exc_type is None)

    # -- grading --------------------------------------------------------------------------
    def grade(self, submission: str | Path, *, labs: list[str] | None = None,
              visibility: tuple[str, ...] | None = None,
              name: str | None = None, clock: LabClock | None = None) -> SubmissionResult:
        """Grade one submission: a folder of lab files, one lab file, a notebook or a zip.

        ``labs``: the labs to grade (default: all of the rubric's); every lab file of the
        submission reaches the workers all the same, since a lab may import another.
        SubmissionError if the submission cannot be graded at all; GraderFault if the
        grader failed (never scored). ``clock``: charged with each lab's CPU time
        (``engine.lab_clock``; a batch reports it per lab).
        """
        labs = self._labs(labs)
        visibility = tuple(visibility or self.visibility)
        submission = Path(submission)
        if submission.suffix.lower() == ".zip" and submission.is_file() \
                and not submission.is_symlink():
            with tempfile.TemporaryDirectory(prefix="grader-zip-") as tmp:   # mode 0700
                try:
                    unpack_zip(submission, Path(tmp) / "submission")
                except ZipRejected as exc:
                    raise ZipRejected(f"{submission}: {exc}") from None
                return self.grade(Path(tmp) / "submission", labs=labs, visibility=visibility,
                                  name=name or submission.stem, clock=clock)
        started = time.monotonic()
        clean = sanitize(submission, self.rubric, list(self.rubric.labs),
                         solutions=self.course.solutions)
        # "." has no name of its own: the folder it stands for has ("Feedback for alice").
        return self.grade_sanitized(clean, labs=labs, visibility=visibility,
                                    name=name or submission.name or submission.resolve().name,
                                    started=started, clock=clock)

    def grade_sanitized(self, clean: Sanitized, *, name: str, labs: list[str] | None = None,
                        visibility: tuple[str, ...] | None = None,
                        started: float | None = None,
                        clock: LabClock | None = None) -> SubmissionResult:
        """Grade lab sources that ``intake.sanitize`` already read, with this Grader's
        rubric (every lab: a lab may import another): ``grade`` is sanitize, then this.
        A batch on a Dask cluster sanitizes on its client and grades here on a worker
        (``grader.batch.cluster``), so both give the same result for the same files.
        ``started``: when the grading began (``time.monotonic()``), for execution_time;
        ``clock``: as for ``grade``."""
        started = time.monotonic() if started is None else started
        labs = self._labs(labs)
        visibility = tuple(visibility or self.visibility)
        plan = self.call_plan(labs, visibility) if self.send_ahead else None
        result = self._grade_clean(clean, labs, visibility, name, plan=plan, clock=clock)
        result.execution_time = time.monotonic() - started
        return result

    def isolation_problem(self, secrets: list[Path]) -> str | None:
        """None if a worker runs unprivileged and sees none of ``secrets``; else what is
        wrong (the Gradescope runner checks this before any submission code runs)."""
        from grader.sandbox import protocol
        self.start()
        scratch = make_scratch({f"{PROBE_LAB}.py": _PROBE_SOURCE.encode()})
        worker = None
        try:
            worker = self._zygote.spawn(submission=scratch.name, lab=PROBE_LAB, forbidden=[])
            reply = worker.request(protocol.call_request("identity", [[str(p) for p in secrets]],
                                                         {}), timeout_s=60)
        except Exception as exc:  # noqa: BLE001 - any failure to start is the answer
            return f"a sandbox worker could not start ({type(exc).__name__}: {exc})"
        finally:
            if worker is not None:
                worker.kill()
            scratch.cleanup()
        if not isinstance(reply, dict) or "ok" not in reply:
            return f"the sandbox probe failed: {reply!r}"
        uid, seen = reply["ok"]
        if os.geteuid() == 0 and uid == 0:
            return "sandbox workers run as root (the sandbox fell back to plain mode)"
        visible = [str(p) for p, s in zip(secrets, seen, strict=False) if s]
        if visible:
            return f"sandbox workers can see {', '.join(visible)}"
        return None

    # -- the steps ------------------------------------------------------------------------
    def _labs(self, labs: list[str] | None) -> list[str]:
        labs = list(labs or self.rubric.labs)
        for lab in labs:
            if lab not in self.rubric.labs:
                raise SubmissionError(f"unknown lab {lab!r}; the labs are "
                                      f"{', '.join(self.rubric.labs)}")
        return labs

    def _runner(self, visibility: tuple[str, ...]) -> SuiteRunner:
        """The long-lived pytest session for ``visibility`` (every lab's suites)."""
        runner = self._runners.get(visibility)
        if runner is None:
            from grader.engine.suite_runner import SuiteRunner
            # pytest's start-up output stays off stdout.
            with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
                runner = SuiteRunner(rubric=self.rubric, visibility=visibility,
                                     secret=self.secret if self.graded else b"",
                                     solutions=self.course.solutions).start()
            self._runners[visibility] = runner
        return runner

    def call_plan(self, labs: list[str] | None = None,
                  visibility: tuple[str, ...] | None = None) -> CallPlan | None:
        """The call plan for these labs (default: all, at the Grader's visibility): the
        reference solutions graded once, one call at a time, recording each test's first
        request (``Session(recording=...)``). None without solutions, or if recording
        failed: grading then goes one call at a time."""
        labs = self._labs(labs)
        visibility = tuple(visibility or self.visibility)
        key = (tuple(labs), visibility)
        if key not in self._plans:
            plan = None
            if self.course.solutions.is_dir():
                from grader.engine.call_plan import CallPlan
                plan = CallPlan()
                try:
                    self._grade_clean(sanitize(self.course.solutions, self.rubric,
                                               list(self.rubric.labs),
                                               solutions=self.course.solutions),
                                      labs, visibility, "solutions", plan=None, recording=plan)
                except Exception:  # noqa: BLE001 - without a plan, grading only goes slower
                    plan = None
            self._plans[key] = plan
        return self._plans[key]

    @property
    def _importable(self) -> dict[str, dict[str, tuple[str, ...]]]:
        """Lab -> the earlier labs it may import, and their contract functions (the
        rubric's ``exports``; ``Rubric.importable``)."""
        return {lab: self.rubric.importable(lab) for lab in self.rubric.labs}

    @property
    def _reference_dir(self) -> str | None:
        """A folder holding the course's reference solutions, readable by workers: calls
        into other labs are answered there, in reference workers (``lab_imports:
        reference``, the default, wherever the solutions are at hand); None when each lab
        imports the student's own files (``lab_imports: student``, cumulative grading, or a
        kit without the solutions: a student's own check)."""
        if self.rubric.lab_imports != "reference" or not self.course.solutions.is_dir():
            return None
        if self._reference_scratch is None:
            self._reference_scratch = make_scratch(
                {f.name: f.read_bytes() for f in sorted(self.course.solutions.glob("lab*.py"))})
        return self._reference_scratch.name

    def _grade_clean(self, clean: Sanitized, labs: list[str], visibility: tuple[str, ...],
                     name: str, *, plan: CallPlan | None,
                     recording: CallPlan | None = None,
                     clock: LabClock | None = None) -> SubmissionResult:
        from grader.engine.student import Session
        self.start()
        problems = {lab: p for lab, p in clean.problems.items() if lab in labs}
        scratch = make_scratch(clean.files)
        session = Session(zygote=self._zygote, submission_dir=scratch.name,
                          forbidden={lab: spec.forbidden for lab, spec in self.rubric.labs.items()},
                          importable=self._importable, reference_dir=self._reference_dir,
                          imports_when_graded=self.rubric.lab_imports,
                          plan=plan, recording=recording, solutions=str(self.course.solutions),
                          clock=clock)
        outcomes: list[TestResult] = []
        collection_errors: list[str] = []
        try:
            runnable = []
            for lab in labs:
                if lab in problems:
                    continue
                if clock is not None:
                    clock.switch(lab, "import")
                session.start_test(self.rubric.labs[lab].time_limit_s)
                error = session.probe(lab, names=required_names(self.rubric.labs[lab].file,
                                                                   self.course.solutions))
                if error is not None and error.kind == "forbidden":
                    # Found in the source before any test ran, on whatever branch it sits.
                    problems[lab] = Problem(LabStatus.FORBIDDEN_API, error.describe(
                        hidden=False) + (" (the whole file is checked before any test runs, "
                                         "branches the tests might not take included)"))
                elif error is not None:
                    problems[lab] = Problem(LabStatus.IMPORT_ERROR, error.describe(hidden=False))
                else:
                    runnable.append(lab)
            if runnable:
                outcomes, collection_errors = self._runner(visibility).run(session, runnable)
        finally:
            if clock is not None:
                clock.switch(OUTSIDE)
            session.close()
            scratch.cleanup()
        if not self._zygote.alive or session.fault is not None:
            # Every call after the sandbox failed was a "crash": not the student's doing.
            why = "its zygote stopped" if not self._zygote.alive else session.fault
            raise SandboxError(f"the sandbox failed during grading ({why}; not the "
                               "submission's doing); grade it again")
        result = score(name, self.rubric, labs, visibility, outcomes, problems,
                       collection_errors)
        if result.fault is Fault.GRADER:
            # A graded lab's test has no outcome: the grader's fault, never scored.
            why = "; ".join(collection_errors)[:500] or "no outcome"
            raise GradingIncomplete(f"{result.status} ({why}); nothing was scored, grade it "
                                    "again")
        result.notes.extend(capped(n, TEST_TEXT_CAP) for n in clean.notes[:MAX_NOTES])
        return result


def grade_submission(submission: str | Path, *, course: Course,
                     labs: list[str] | None = None,
                     visibility: tuple[str, ...] = VISIBILITIES,
                     name: str | None = None, graded: bool | None = None) -> SubmissionResult:
    """Grade one submission with a Grader of its own (started and closed here).
    ``graded``: the run gives points (``Grader``'s; a route that writes points on public
    tests alone says True)."""
    # One submission's few workers do not repay preparing the zygote's heap for many forks.
    grader = Grader(course, visibility=visibility, many_workers=False, graded=graded)
    try:
        # The sandbox and the pytest session start side by side (``Grader.start``).
        grader.start(suites=True)
        result = grader.grade(submission, labs=labs, name=name)
    except BaseException:
        grader.close(wait=False)        # as ``with Grader(...)`` leaves on an error
        raise
    grader.close()
    return result


def retry_with_a_fresh_grader(grader: Grader, new_grader: Callable[[], Grader],
                              attempt: Callable[[Grader], T],
                              grader_failed: Callable[[T], bool]) -> tuple[T, Grader]:
    """``attempt(grader)``, and once more with a fresh Grader (``new_grader()``) when
    ``grader_failed`` says the outcome is a fault of the grader's own: a broken sandbox or
    pytest session is never kept for the next try, or for the next submission. The one
    recovery of every route (a batch's students, Gradescope's labs). Returns the last
    outcome, which is final (a grader fault twice is reported, never scored), and the
    Grader to go on with, which the caller keeps."""
    for tries_left in (1, 0):
        outcome = attempt(grader)
        if not grader_failed(outcome):
            break
        grader.close(wait=False)        # a test may still hang in it: do not wait
        grader = new_grader()
        if not tries_left:
            break
    return outcome, grader


# What ``load_engine`` imports (a batch's forkserver preloads them: ``grader.batch.pool``).
ENGINE_MODULES = ("grader.engine.call_plan", "grader.engine.student",
                  "grader.engine.suite_runner")


def load_engine() -> None:
    """Import what grading needs beyond the standard library (torch, pytest, the engine).

    ``import grader.grading`` does not, so a one-off command (``grader check``) can launch
    its zygote first (``Grader.start``) and import torch while the zygote imports its own.
    The first time in a process, the heap as it stands is frozen (``gc.freeze``): the
    imported modules live as long as the process, and no later collection, nor the
    interpreter's exit, walks them again (exiting with torch loaded took 0.5-0.8 s here).
    The collector is off while they load (~10% of torch's import time; the few thousand
    objects of garbage the imports leave are frozen with them).
    """
    global _ENGINE_LOADED
    if _ENGINE_LOADED:
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        import grader.engine.call_plan  # noqa: F401
        import grader.engine.student  # noqa: F401
        import grader.engine.suite_runner  # noqa: F401
        _ENGINE_LOADED = True
        gc.freeze()
    finally:
        if enabled:
            gc.enable()


_ENGINE_LOADED = False


PROBE_LAB = "lab0_sandbox_probe"
_PROBE_SOURCE = '''
import os

def identity(paths):
    return [os.getuid(), [os.path.exists(p) for p in paths]]
'''


def required_names(filename: str, solutions: Path) -> list[str]:
    """The public top-level functions and classes of the reference solution (the contract)
    in the folder ``solutions``."""
    path = Path(solutions) / filename
    if not path.is_file():
        return []
    st = path.stat()
    # Asked for every lab of every submission: parsed once per version of the file.
    return list(_public_names(str(path), st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=32)
def _public_names(path: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    return tuple(node.name for node in tree.body
                 if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                 and not node.name.startswith("_"))


def score(submission_name: str, rubric: Rubric, labs: list[str], visibility: tuple[str, ...],
          outcomes: list[TestResult], lab_problems: dict[str, Problem],
          collection_errors: list[str]) -> SubmissionResult:
    """One TestResult per rubric test from the plugin's (one per case); a parametrized test
    passes only if all its cases pass.

    ``lab_problems``: lab -> why it could not be graded (the student's doing: status
    ``missing``, ``error``, ``import_error`` or ``forbidden_api``); its tests fail with the
    message. A graded lab's test with no outcome is the grader's fault (``result.fault``).
    """
    by_test: dict[tuple[str, str], list[TestResult]] = {}
    for o in outcomes:
        by_test.setdefault((o.lab, o.name), []).append(o)
    result = SubmissionResult(submission=submission_name)
    for lab in labs:
        spec = rubric.labs[lab]
        problem = lab_problems.get(lab)
        status = problem.kind if problem else LabStatus.GRADED
        message = problem.message if problem else ""
        lab_result = LabResult(name=lab, title=spec.title, file=spec.file, status=status,
                               message=message, reason=problem.reason if problem else "")
        for name, t in spec.tests.items():
            if t.visibility not in visibility:
                continue
            cases = by_test.get((lab, name), [])
            if status != LabStatus.GRADED:
                passed, msg, desc, dur = False, message, "", 0.0
            elif not cases:
                # A graded lab's test always runs: this is the grader's fault, never the
                # student's, and the whole result says so.
                passed, msg, desc, dur = False, "the test did not run (a grader error)", "", 0.0
                result.status = ("grader error: a suite failed to load" if collection_errors
                                 else "grader error: a test did not run")
                result.fault = Fault.GRADER
            else:
                failed = [c for c in cases if not c.passed]
                passed = not failed
                desc = cases[0].description
                dur = sum(c.duration_s for c in cases)
                # A passed public test may report something (lab 8: the training's figures).
                msg = next((c.message for c in cases if c.message), "") \
                    if not failed and t.visibility == "public" else ""
                if failed:
                    first = failed[0]
                    case = f"[{first.case}] " if first.case and t.visibility == "public" else ""
                    msg = case + first.message
                    if len(cases) > 1:
                        msg += f" ({len(failed)} of {len(cases)} cases failed)"
            # The first failed case's named mistake and pictures (none for hidden tests); a
            # passed test keeps a picture of what it measured (lab 8's loss curve).
            diagnosis = next((c.diagnosis for c in cases if not c.passed and c.diagnosis), "")
            shown = cases if passed else [c for c in cases if not c.passed]
            artifacts = [] if t.visibility != "public" else next(
                (c.artifacts for c in shown if c.artifacts), [])
            # Deferred (not measured on this machine) when a case was and none failed.
            deferred = bool(cases) and any(c.deferred for c in cases) and all(
                c.passed or c.deferred for c in cases)
            if deferred:
                msg = next(c.message for c in cases if c.deferred)
            lab_result.tests.append(TestResult(
                lab=lab, name=name, description=desc, visibility=t.visibility,
                max_score=t.points, passed=passed, message=capped(msg, TEST_TEXT_CAP),
                duration_s=dur, diagnosis="" if passed or deferred
                else capped(diagnosis, TEST_TEXT_CAP), artifacts=artifacts,
                deferred=deferred))
        result.labs.append(lab_result)
    return result
