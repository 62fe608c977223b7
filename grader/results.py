"""The result model: plain dataclasses, scores from the rubric, and views of them.

Every output (Gradescope results.json, the terminal table, CSV rows, ...) is a function of a
``SubmissionResult``. Writes are atomic: a killed grader leaves the old file or the new one.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path

# How a rubric visibility maps to Gradescope's: hidden tests appear after grades are published.
GRADESCOPE_VISIBILITY = {"public": "visible", "hidden": "after_published"}


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
    status: str = "graded"       # graded | missing | import_error | error
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

    def to_gradescope(self) -> dict:
        """Gradescope's results.json (top-level score, tests[] with per-test fields)."""
        tests = []
        for lab in self.labs:
            for t in lab.tests:
                tests.append({
                    "name": f"{lab.name}: {t.name}",
                    "name_format": "text",
                    "score": round(t.score, 4),
                    "max_score": round(t.max_score, 4),
                    "status": t.status,
                    "visibility": GRADESCOPE_VISIBILITY[t.visibility],
                    "output": _output_text(t),
                    "output_format": "text",
                    "tags": [lab.name],
                })
        notes = [f"{lab.file}: {lab.message}" for lab in self.labs if lab.message]
        return {
            "score": round(self.score, 4),
            "execution_time": round(self.execution_time, 3),
            "output": "\n".join(self.notes + notes),
            "output_format": "text",
            "visibility": "visible",
            "stdout_visibility": "hidden",
            "tests": tests,
            "extra_data": {"labs": {lab.name: {"score": round(lab.score, 4),
                                               "max_score": round(lab.max_score, 4),
                                               "status": lab.status} for lab in self.labs},
                           "status": self.status},
        }


def _output_text(t: TestResult) -> str:
    lines = [t.description] if t.description else []
    if not t.passed and t.message:
        lines.append(t.message)
    if not t.passed and t.diagnosis:
        lines.append(f"Diagnosis: {t.diagnosis}")
    return "\n".join(lines)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_gradescope(result: SubmissionResult, path: Path) -> None:
    atomic_write_text(path, json.dumps(result.to_gradescope(), indent=2) + "\n")


def render_table(result: SubmissionResult, *, console=None, show_passed: bool = True) -> None:
    """A terminal table per lab and test (rich), with failure messages under each failure."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    for lab in result.labs:
        table = Table(title=f"{lab.name} - {lab.title}: {lab.score:g}/{lab.max_score:g}",
                      title_justify="left", expand=False, show_lines=False)
        table.add_column("test")
        table.add_column("result")
        table.add_column("points", justify="right")
        table.add_column("why", overflow="fold", max_width=90)
        if lab.message:
            console.print(f"[bold]{lab.file}[/bold]: {lab.message}", markup=True, highlight=False)
        for t in lab.tests:
            if t.passed and not show_passed:
                continue
            mark = "[green]pass[/green]" if t.passed else "[red]FAIL[/red]"
            why = "" if t.passed else (t.message + (f"\nDiagnosis: {t.diagnosis}" if t.diagnosis else ""))
            name = t.name + (" (hidden)" if t.visibility == "hidden" else "")
            table.add_row(name, mark, f"{t.score:g}/{t.max_score:g}", _escape(why))
        console.print(table)
    console.print(f"[bold]Total: {result.score:g}/{result.max_score:g}[/bold]"
                  f"  ({result.execution_time:.2f} s)")


def _escape(text: str) -> str:
    from rich.markup import escape
    return escape(text)
