"""The result model: plain dataclasses for test, lab and submission results.

Every output (``grader.outputs``: Gradescope results.json, JUnit, GitHub Classroom, the
terminal table, HTML feedback, the CSV gradebook) is a function of a ``SubmissionResult``.

Whose fault it is is data, not words: a lab or submission that was not graded carries a
``Fault`` (the student's, the grader's or the platform's), and every output reads that
field. A status's or message's text is for people; no module decides anything by it. The
enums are ``str``-valued, so JSON and CSV hold the same words as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum

OK = "ok"                        # a SubmissionResult's status when it was graded


class _Words(str, Enum):
    """A str-valued enum that prints as its value (``enum.StrEnum`` is Python 3.11+)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Fault(_Words):
    """Why something was not graded, by whose doing."""
    STUDENT = "student"          # the submission: a missing file, a rejected zip, no import
    GRADER = "grader"            # the grader's own failure: never scored, graded again
    PLATFORM = "platform"        # where it runs: a time limit, a sandbox it cannot build


def is_grader_fault(fault: Fault | None) -> bool:
    """True when the grader or its platform, not the submission, is why there is no grade."""
    return fault in (Fault.GRADER, Fault.PLATFORM)


class LabStatus(_Words):
    GRADED = "graded"
    MISSING = "missing"              # no file for the lab
    ERROR = "error"                  # a file that cannot be used, or the lab was not graded
    IMPORT_ERROR = "import_error"
    FORBIDDEN_API = "forbidden_api"


class TestStatus(_Words):
    __test__ = False  # not a pytest test class

    PASSED = "passed"
    FAILED = "failed"
    # Not measured on this machine (the portable backend: no memory figures): measured when
    # the work is graded; neither passed nor failed, and its points are not in the total.
    DEFERRED = "measured when graded"


def read_fault(data: dict) -> Fault | None:
    """The fault a serialised result (``to_dict``, or results.json's ``extra_data``) records.

    A file written before faults were recorded has no ``fault`` key: such a file was kept
    (it has a fingerprint) only when grading went through, so anything but ``ok`` there was
    the submission's own doing (grader faults are never kept)."""
    if "fault" in data:
        return Fault(data["fault"]) if data["fault"] else None
    return None if data.get("status", OK) == OK else Fault.STUDENT



@dataclass
class TestResult:
    """One test's outcome: one case of it as the pytest plugin records it (``case``: the
    parametrization id), or the rubric test as scored (all its cases; ``case`` "")."""
    __test__ = False  # not a pytest test class

    lab: str
    name: str
    description: str
    visibility: str              # public | hidden
    max_score: float
    passed: bool
    message: str = ""            # already filtered for the test's visibility
    duration_s: float = 0.0
    diagnosis: str = ""          # a named mistake, when one was recognised
    case: str = ""               # the parametrization id of one case, or ""
    deferred: bool = False       # TestStatus.DEFERRED: not measured here (see there)
    # Arrays for the HTML feedback's pictures (public tests only). Kept in the grading
    # process and never serialised: to_dict and every output built on it leave it out.
    artifacts: list = field(default_factory=list, repr=False, compare=False)

    @property
    def score(self) -> float:
        return self.max_score if self.passed else 0.0

    @property
    def status(self) -> TestStatus:
        if self.deferred:
            return TestStatus.DEFERRED
        return TestStatus.PASSED if self.passed else TestStatus.FAILED

    def to_dict(self) -> dict:
        plain = {f.name: getattr(self, f.name) for f in fields(self)
                 if f.name not in ("artifacts", "case")}
        return {**plain, "score": self.score, "status": self.status}


@dataclass
class LabResult:
    name: str                    # module name, e.g. lab1_attention
    title: str
    file: str
    status: LabStatus = LabStatus.GRADED
    message: str = ""
    tests: list[TestResult] = field(default_factory=list)
    fault: Fault | None = None   # None when graded; a lab not graded is the student's by default
    reason: str = ""             # the message's one-line gist (no file listing), for summaries

    def __post_init__(self) -> None:
        self.status = LabStatus(self.status)
        if self.fault is None and self.status is not LabStatus.GRADED:
            self.fault = Fault.STUDENT
        self.fault = Fault(self.fault) if self.fault else None
        if not self.reason and self.status is not LabStatus.GRADED:
            self.reason = (self.message.splitlines() or [""])[0]

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        # A deferred test's points are the graded run's to give: no loss is shown here.
        return sum(t.max_score for t in self.tests if not t.deferred)

    def to_dict(self) -> dict:
        return {"name": self.name, "title": self.title, "file": self.file,
                "status": self.status, "fault": self.fault, "message": self.message,
                "score": self.score,
                "max_score": self.max_score, "tests": [t.to_dict() for t in self.tests]}


@dataclass
class SubmissionResult:
    submission: str
    labs: list[LabResult] = field(default_factory=list)
    execution_time: float = 0.0
    status: str = OK             # ok, or why the submission could not be graded (for people)
    notes: list[str] = field(default_factory=list)
    fault: Fault | None = None   # whose doing it is that it was not (all) graded; None: it was

    def __post_init__(self) -> None:
        self.fault = Fault(self.fault) if self.fault else None

    @property
    def score(self) -> float:
        return sum(lab.score for lab in self.labs)

    @property
    def max_score(self) -> float:
        return sum(lab.max_score for lab in self.labs)

    def lab(self, name: str) -> LabResult:
        return next(lab for lab in self.labs if lab.name == name)

    def to_dict(self) -> dict:
        return {"submission": self.submission, "status": self.status, "fault": self.fault,
                "score": self.score,
                "max_score": self.max_score, "execution_time": self.execution_time,
                "notes": list(self.notes), "labs": [lab.to_dict() for lab in self.labs]}

    def to_dict_without_timings(self) -> dict:
        """``to_dict`` less the timings: all two gradings of one submission may differ in."""
        data = self.to_dict()
        del data["execution_time"]
        for lab in data["labs"]:
            for test in lab["tests"]:
                del test["duration_s"]
        return data
