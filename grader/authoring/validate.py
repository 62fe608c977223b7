"""``grader validate``: the instructor's self-check before releasing or grading.

Passes when the rubric loads and agrees with the suites, the committed stubs are what the
generator writes and hold no solution code, the solutions score full marks, and the
untouched stubs score 0 with every test failing on NotImplementedError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from grader import paths
from grader.authoring.stubs import leaked_solution_lines, stub_drift
from grader.errors import RubricError
from grader.grading import Grader
from grader.rubric import check_rubric_against_suites, load_rubric


@dataclass
class ValidateReport:
    lines: list[str] = field(default_factory=list)
    ok: bool = True

    def check(self, name: str, problems: list[str]) -> None:
        self.lines.append(f"{'ok  ' if not problems else 'FAIL'} {name}")
        self.lines.extend(f"     {p}" for p in problems)
        self.ok = self.ok and not problems


def validate(*, rubric_path: Path | None = None, solutions_dir: Path | None = None,
             exercises_dir: Path | None = None, suites_dir: Path | None = None) -> ValidateReport:
    """Check the course (default: ``paths``' course, read now, not at import)."""
    rubric_path = Path(rubric_path or paths.RUBRIC)
    solutions_dir = Path(solutions_dir or paths.SOLUTIONS)
    exercises_dir = Path(exercises_dir or paths.EXERCISES)
    suites_dir = Path(suites_dir or paths.SUITES)
    report = ValidateReport()
    try:
        rubric = load_rubric(rubric_path)
    except RubricError as exc:
        report.check("rubric loads", exc.errors)
        return report
    report.check("rubric loads", [])
    report.check("rubric and suites agree", check_rubric_against_suites(rubric, suites_dir))
    report.check("stubs are in sync with solutions",
                 stub_drift(solutions_dir=solutions_dir, exercises_dir=exercises_dir))
    report.check("stubs hold no solution code",
                 leaked_solution_lines(solutions_dir=solutions_dir, exercises_dir=exercises_dir))
    with Grader(rubric) as grader:
        ref = grader.grade(solutions_dir)
        report.check(f"solutions score full marks ({ref.score:g}/{ref.max_score:g})", [
            f"{lab.name}::{t.name}: {t.message}" for lab in ref.labs for t in lab.tests
            if not t.passed
        ] + [f"{lab.file}: {lab.message}" for lab in ref.labs if lab.status != "graded"])
        stub = grader.grade(exercises_dir)
        report.check(f"untouched stubs score 0 ({stub.score:g}/{stub.max_score:g})", [
            f"{lab.name}::{t.name}: " + ("passed" if t.passed else f"failed otherwise: {t.message}")
            for lab in stub.labs for t in lab.tests
            if t.passed or not t.message.startswith("not implemented yet")
        ])
    return report
