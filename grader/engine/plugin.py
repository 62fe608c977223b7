"""The grading hooks, as a pytest plugin: fixtures, per-test time limits, result capture.

``GradingPlugin`` is registered by ``grader.grading`` when it runs the suites (pytest runs
in the trusted process; student code only ever runs in sandbox workers behind the
``student`` fixture). It gives each test its ``student`` proxy, its rubric tolerance and a
seeded generator, starts the test's wall-clock budget, and records every outcome (one
``grader.results.TestResult`` per case, the type every output reads) with a message fit for
the test's visibility.
"""

from __future__ import annotations

import builtins
import inspect
import re
import zlib
from pathlib import Path

import pytest
import torch

from grader.engine.compare import Mismatch
from grader.results import TestResult
from grader.rubric import Rubric
from grader.secret import (graded_public_seed, hidden_seed, submission_digest,
                           training_start_seed)
from grader.engine.student import (SHOWN_EXCEPTIONS, MissingRaise, NotMeasuredHere, Session, StudentError,
                                    StudentLab)

STDOUT_SHOWN = 600
# In a graded run (a course secret: grade, batch, Gradescope, Classroom, nbgrader), what a
# public test shows of the student's own text (an exception's type name, message and place,
# what it printed) is capped at this many characters a field, and every run of characters
# that could be encoded data is cut (issue #44: a type name carrying the call's inputs as
# base64 filled a table that answered the next run).
# 300: the import guard's own sentence ("... may import only: lab1_attention.causal_mask,
# ...") must fit; the defence is the run's own inputs, this cap a second layer.
GRADED_TEXT_SHOWN = 300
_NOT_PLAIN = re.compile(r"[^\x20-\x7e\n]+")
_ENCODED_RUN = re.compile(r"[A-Za-z0-9+/=_-]{33,}|(?:[-+]?[0-9][0-9.eE+-]*[,;\s|x:]*){6,}")


def shown_when_graded(text: str, cap: int = GRADED_TEXT_SHOWN) -> str:
    """The student's ``text`` as a graded run shows it: runs that could carry data (long
    tokens, base64-like runs, series of numbers) replaced by "...", then capped. Only
    printable ASCII is shown: a run of other characters (CJK identifiers carry two bytes
    each past the patterns) is one "?"."""
    text = _NOT_PLAIN.sub("?", text or "")
    text = _ENCODED_RUN.sub("...", text)
    return text if len(text) <= cap else text[:cap] + "..."


def type_name_when_graded(name: str) -> str:
    """An exception's type as a graded run names it: Python's and torch's own by name, any
    type the student made as "an exception" (as hidden tests do; #44)."""
    return name if name in SHOWN_EXCEPTIONS else "an exception"


# Exception groups keep pytest's own report (BaseExceptionGroup is new in Python 3.11).
_EXCEPTION_GROUPS = tuple(filter(None, [getattr(builtins, "BaseExceptionGroup", None)]))


def lab_of(item) -> str:
    return item.path.stem.removeprefix("test_")


def visibility_of(item) -> str:
    return item.path.parent.name


def test_description(doc: str | None) -> str:
    """A test's description: its docstring's first paragraph on one line (its first line
    alone stops mid-sentence where the docstring wraps)."""
    return " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())


def describe_failure(exc: BaseException, *, hidden: bool, stdout: str,
                     graded: bool = False) -> str:
    """What the student reads for a failed test; hidden tests never show values. ``graded``:
    a graded run, where a public test shows the student's own text only through
    ``shown_when_graded``."""
    scrub = shown_when_graded if graded else None
    if isinstance(exc, (Mismatch, MissingRaise)):
        text = exc.hidden if hidden else exc.public
    elif isinstance(exc, StudentError):
        text = exc.describe(hidden=hidden, scrub=scrub,
                            type_scrub=type_name_when_graded if graded else None)
    elif isinstance(exc, AssertionError):
        detail = str(exc).split("\nassert ")[0].strip()
        text = "a check failed" + ("" if hidden or not detail else f": {detail}")
    else:
        # The test could not use what student code returned (e.g. one value where the
        # contract promises a tuple): say so, without the test's internals.
        detail = str(exc) if scrub is None else scrub(str(exc))
        text = (f"the returned value has the wrong form ({type(exc).__name__}"
                + ("" if hidden else f": {detail}") + "); check the contract's return types")
    if stdout and not hidden:
        shown = stdout[:STDOUT_SHOWN] if scrub is None else scrub(stdout)
        text += "\nYour code printed:\n" + shown
    return text


REPORT_PROPERTY = "report"   # a public test's user property: its message when it passes


class GradingPlugin:
    def __init__(self, *, rubric: Rubric, session: Session, secret: bytes = b""):
        self.rubric = rubric
        self.secret = secret        # the course secret: hidden tests' inputs (grader.secret)
        self.session = session
        self._digest: tuple[str, str] = ("", "")  # (submission folder, its files' digest)
        self.outcomes: list[TestResult] = []     # one per test case
        self.collection_errors: list[str] = []
        # Failed tests of this run whose calls fit several catalogued mistakes, with them
        # (``settle_diagnoses``).
        self.ambiguous: list[tuple[TestResult, list[str]]] = []

    # -- fixtures -------------------------------------------------------------------------
    # ``pytest_runtest_setup`` below hands these values to each test directly; the fixtures
    # declare the names (for collection, and for any fixture that asks for them).
    def _value(self, name: str, item):
        if name == "student":
            return StudentLab(self.session, lab_of(item))
        if name == "tol":
            return self._rubric_test(item).tolerance
        if name == "budget":
            return self._rubric_test(item).budget
        if name == "training_start":
            return self._training_start(lab_of(item))
        if name == "module_gen":
            # One stream for the whole module: inputs that several tests judge together.
            return self._generator(item, item.nodeid.split("::", 1)[0] + "::(module)")
        return self._generator(item, item.nodeid)

    def _generator(self, item, key: str) -> torch.Generator:
        """The inputs' generator of ``key`` (a test's node id) for ``item``'s visibility."""
        if self.secret and visibility_of(item) == "hidden":
            # This course's own inputs: a table leaked from another course scores nothing.
            return torch.Generator().manual_seed(hidden_seed(self.secret, key))
        if self.graded:
            # This run's own inputs: a table leaked from another run's feedback (public
            # tests show the student's messages) scores nothing (grader.secret).
            return torch.Generator().manual_seed(
                graded_public_seed(self.secret, key, self._submission_digest()))
        # crc32 of the node id, not hash(): the same inputs on every run and machine.
        return torch.Generator().manual_seed(zlib.crc32(key.encode()))

    @pytest.fixture
    def student(self, request) -> StudentLab:
        return self._value("student", request.node)

    @pytest.fixture
    def tol(self, request):
        return self._value("tol", request.node)

    @pytest.fixture
    def budget(self, request):
        """The rubric's resource budget of a resource test (grader.rubric.Budget)."""
        return self._value("budget", request.node)

    @pytest.fixture
    def gen(self, request) -> torch.Generator:
        return self._value("gen", request.node)

    @pytest.fixture
    def module_gen(self, request) -> torch.Generator:
        """``gen`` of the test's module rather than of the test: the same draws in every
        test of the module that asks (lab 8's held-out sequences, which three tiers score:
        one evaluation of the trained weights serves them all)."""
        return self._value("module_gen", request.node)

    @pytest.fixture
    def training_start(self, request) -> int:
        """The seed of the initial weights the grader gives the lab's training (lab 8):
        one per grading of a lab file, from the course secret (grader.secret)."""
        return self._value("training_start", request.node)

    @property
    def graded(self) -> bool:
        """A graded run (grade, batch, Gradescope, Classroom, nbgrader): it has the course
        secret; a student's own check has none."""
        return bool(self.secret)

    def _submission_digest(self) -> str:
        """The digest of the lab files handed in (``grader.secret.submission_digest``),
        once per submission."""
        folder = str(self.session.submission_dir)
        if self._digest[0] != folder:
            files = {}
            for path in sorted(Path(folder).glob("*.py")):
                try:
                    files[path.name] = path.read_bytes()
                except OSError:
                    continue
            self._digest = (folder, submission_digest(files))
        return self._digest[1]

    def _training_start(self, lab: str) -> int:
        path = Path(self.session.submission_dir) / f"{lab}.py"
        try:
            source = path.read_bytes()
        except OSError:
            source = b""
        return training_start_seed(self.secret, lab, source)

    # -- hooks ----------------------------------------------------------------------------
    def _rubric_test(self, item):
        return self.rubric.test(lab_of(item), item.originalname)

    def pytest_collectreport(self, report):
        if report.failed:
            self.collection_errors.append(f"{report.nodeid}: {report.longreprtext[-2000:]}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        self.session.start_test(self._rubric_test(item).time_limit_s, test=item.nodeid,
                                lab=lab_of(item),
                                plannable=not (self.graded and visibility_of(item) == "public"))
        self.session.last_stdout = ""
        # Our fixtures' values go straight into the test's arguments: pytest then skips its
        # fixture machinery for them (a request object and a signature inspection per
        # fixture: ~0.3 ms a test, a tenth of the grading process's time per submission).
        funcargs = getattr(item, "funcargs", None)
        if isinstance(funcargs, dict):
            for name in ("student", "tol", "gen"):
                if name in item.fixturenames and name not in funcargs:
                    funcargs[name] = self._value(name, item)

    @pytest.hookimpl(tryfirst=True, specname="pytest_runtest_makereport")
    def pytest_runtest_makereport_plain(self, item, call):
        """A failed test's report without pytest's formatted traceback.

        Nothing reads that traceback (students get ``describe_failure``'s message, and no
        terminal is attached), yet formatting it reads and parses the suites' source for
        every failure: 50 ms a failed test here, most of a buggy submission's grading time.
        Skips, and anything unusual, keep pytest's own report.
        """
        excinfo = call.excinfo
        if (excinfo is None or not isinstance(excinfo, pytest.ExceptionInfo)
                or isinstance(excinfo.value, (pytest.skip.Exception, *_EXCEPTION_GROUPS))):
            return None
        try:
            text = f"{excinfo.typename}: {excinfo.value}"[:2000]
        except Exception:  # noqa: BLE001 - an exception whose str() fails
            text = excinfo.typename
        return pytest.TestReport(item.nodeid, item.location, dict.fromkeys(item.keywords, 1),
                                 "failed", text, call.when, (), call.duration, call.start,
                                 call.stop, user_properties=item.user_properties)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if report.when == "call" or (report.when == "setup" and report.failed):
            hidden = visibility_of(item) == "hidden"
            description = test_description(item.function.__doc__)
            message, diagnosis, artifacts = "", "", []
            candidates: list[str] = []
            deferred = report.failed and call.excinfo is not None and isinstance(
                call.excinfo.value, NotMeasuredHere)
            if deferred:
                message = str(call.excinfo.value)
            elif report.failed and call.excinfo is not None:
                message = describe_failure(call.excinfo.value, hidden=hidden,
                                           stdout=self.session.last_stdout,
                                           graded=self.graded)
                if report.when == "call":
                    candidates, artifacts = self._diagnose(item, call.excinfo.value, hidden)
                    diagnosis = candidates[0] if len(candidates) == 1 else ""
                if diagnosis and isinstance(call.excinfo.value, Mismatch):
                    message = call.excinfo.value.without_hint(message)
            elif report.skipped:
                message = "the test was skipped, which counts as failed"
            elif report.passed and report.when == "call" and not hidden:
                artifacts = self._passed_pictures(item)
                # What the test reports on a pass (lab 8: the training's figures).
                message = str(dict(item.user_properties).get(REPORT_PROPERTY, ""))[:2000]
            callspec = getattr(item, "callspec", None)
            result = TestResult(
                lab=lab_of(item), name=item.originalname, case=callspec.id if callspec else "",
                visibility=visibility_of(item), max_score=self._rubric_test(item).points,
                passed=report.passed and report.when == "call", message=message,
                duration_s=report.duration, description=description, diagnosis=diagnosis,
                artifacts=artifacts, deferred=deferred,
            )
            self.outcomes.append(result)
            if report.failed and report.when == "call" and len(candidates) > 1:
                self.ambiguous.append((result, candidates))

    def settle_diagnoses(self) -> None:
        """After a run: a failed test whose calls fit several catalogued mistakes names the
        one of them that another failed test of its lab names alone, else none (never a
        guess: a greedy decoding on weights the secret drew fitted two mistakes)."""
        named: dict[str, set[str]] = {}
        for t in self.outcomes:
            if t.diagnosis:
                named.setdefault(t.lab, set()).add(t.diagnosis)
        for result, candidates in self.ambiguous:
            fits = [c for c in candidates if c in named.get(result.lab, ())]
            if len(fits) == 1:
                result.diagnosis = fits[0]
        self.ambiguous = []

    def _passed_pictures(self, item) -> list:
        """A passed public training test's loss curve (lab 8's ``model.loss_history``, the
        optional extension), drawn in the feedback; never raises."""
        budget = self._rubric_test(item).budget
        if budget is None or budget.cpu_s is None:
            return []
        try:
            from grader.diagnose import loss_picture
            picture = loss_picture(list(self.session.calls))
            return [picture] if picture is not None else []
        except Exception:  # noqa: BLE001 - feedback must never break grading
            return []

    def _diagnose(self, item, exc: BaseException, hidden: bool) -> tuple[list[str], list]:
        """The catalogued mistakes a failed test's calls fit (and, for public tests,
        pictures); never raises."""
        try:
            from grader.diagnose import examine_candidates
            return examine_candidates(
                lab=lab_of(item), test=item.originalname, exc=exc,
                calls=list(self.session.calls), tol=self._rubric_test(item).tolerance,
                hidden=hidden, budget=self._rubric_test(item).budget)
        except Exception:  # noqa: BLE001 - feedback must never break grading
            return [], []
