"""``grader validate``: the instructor's self-check before releasing or grading.

Passes when the rubric loads and agrees with the suites, the committed stubs are what the
generator writes and hold no solution code, the solutions score full marks, and the
untouched stubs score 0 with every test failing on NotImplementedError, and no stub's
given code scores in another lab's place (grader.authoring.transplant).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from grader.authoring.transplant import candidates
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
        report.check("no lab's given code scores in another lab",
                     _transplants_that_score(grader, course))
        stub = grader.grade(exercises_dir)
        report.check(f"untouched stubs score 0 ({stub.score:g}/{stub.max_score:g})", [
            f"{lab.name}::{t.name}: " + ("passed" if t.passed else f"failed otherwise: {t.message}")
            for lab in stub.labs for t in lab.tests
            if t.passed or not t.message.startswith("not implemented yet")
        ])
    return report


def _transplants_that_score(grader: Grader, course: Course) -> list[str]:
    """Each lab's stub with another lab's given code standing in for the student's parts,
    graded on all of the lab's tests: every test that passes is a problem."""
    rubric = course.parsed_rubric()
    by_file = {spec.file: name for name, spec in rubric.labs.items()}
    problems = []
    with tempfile.TemporaryDirectory(prefix="grader-transplant-") as tmp:
        for n, (lab_file, given, text) in enumerate(candidates(course.exercises,
                                                               list(by_file))):
            folder = Path(tmp) / str(n)
            folder.mkdir()
            for f in by_file:
                if (course.exercises / f).is_file():
                    shutil.copyfile(course.exercises / f, folder / f)
            (folder / lab_file).write_text(text, encoding="utf-8")
            lab = grader.grade(folder, labs=[by_file[lab_file]]).lab(by_file[lab_file])
            problems += [f"{lab.name}::{t.name} passes with {given.lab_file}'s given "
                         f"{given.where} in its place ({t.score:g}/{t.max_score:g})"
                         for t in lab.tests if t.passed]
    return problems
