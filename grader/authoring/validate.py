"""``grader validate``: the instructor's self-check before releasing or grading.

Passes when the rubric loads and agrees with the suites, the committed stubs are what the
generator writes and hold no solution code, the solutions score full marks, and the
untouched stubs score 0 with every test failing on NotImplementedError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from grader.authoring.stubs import leaked_solution_lines, stub_drift
from grader.course import Course
from grader.errors import RubricError
from grader.grading import Grader


@dataclass
class ValidateReport:
    lines: list[str] = field(default_factory=list)
    ok: bool = True

    def check(self, name: str, problems: list[str]) -> None:
        self.lines.append(f"{'ok  ' if not problems else 'FAIL'} {name}")
        self.lines.extend(f"     {p}" for p in problems)
        self.ok = self.ok and not problems


def validate(course: Course) -> ValidateReport:
    """Check ``course``: its rubric, against the suites; its stubs; its solutions score full
    marks and its untouched stubs 0."""
    solutions_dir, exercises_dir = course.solutions, course.exercises
    report = ValidateReport()
    try:
        course.parsed_rubric()
    except RubricError as exc:
        report.check("rubric loads", exc.errors)
        return report
    report.check("rubric loads", [])
    report.check("rubric and suites agree", course.suite_problems())
    report.check("stubs are in sync with solutions",
                 stub_drift(solutions_dir=solutions_dir, exercises_dir=exercises_dir))
    report.check("stubs hold no solution code",
                 leaked_solution_lines(solutions_dir=solutions_dir, exercises_dir=exercises_dir))
    with Grader(course) as grader:       # RubricError (exit 2) if they disagree
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
