"""The result model: plain dataclasses for test, lab and submission results.

Every output (``grader.outputs``: Gradescope results.json, JUnit, GitHub Classroom, the
terminal table, HTML feedback, the CSV gradebook) is a function of a ``SubmissionResult``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields



@dataclass
class TestResult:
    lab: str
    name: str
    description: str
    visibility: str              # public | hidden
    max_score: float
    passed: bool
    message: str = ""            # already filtered for the test's visibility
    duration_s: float = 0.0
    diagnosis: str = ""          # a named mistake, when one was recognised
    # Arrays for the HTML feedback's pictures (public tests only). Kept in the grading
    # process and never serialised: to_dict and every output built on it leave it out.
    artifacts: list = field(default_factory=list, repr=False, compare=False)

    @property
    def score(self) -> float:
        return self.max_score if self.passed else 0.0

    @property
    def status(self) -> str:
        return "passed" if self.passed else "failed"

    def to_dict(self) -> dict:
        plain = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "artifacts"}
        return {**plain, "score": self.score, "status": self.status}


@dataclass
class LabResult:
    name: str                    # module name, e.g. lab1_attention
    title: str
    file: str
    status: str = "graded"       # graded | missing | import_error | forbidden_api | error
    message: str = ""
    tests: list[TestResult] = field(default_factory=list)

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tests)

    def to_dict(self) -> dict:
        return {"name": self.name, "title": self.title, "file": self.file,
                "status": self.status, "message": self.message, "score": self.score,
                "max_score": self.max_score, "tests": [t.to_dict() for t in self.tests]}


@dataclass
class SubmissionResult:
    submission: str
    labs: list[LabResult] = field(default_factory=list)
    execution_time: float = 0.0
    status: str = "ok"           # ok, or why the submission could not be graded
    notes: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        return sum(lab.score for lab in self.labs)

    @property
    def max_score(self) -> float:
        return sum(lab.max_score for lab in self.labs)

    def lab(self, name: str) -> LabResult:
        return next(lab for lab in self.labs if lab.name == name)

    def to_dict(self) -> dict:
        return {"submission": self.submission, "status": self.status, "score": self.score,
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
