"""Gradescope's ``results.json``: a view of the result model (and its atomic writer)."""

from __future__ import annotations

import json
from pathlib import Path

from grader.outputs.atomic import atomic_write_text
from grader.outputs.text import capped
from grader.results import SubmissionResult, TestResult

# How a rubric visibility maps to Gradescope's: hidden tests appear after grades are published.
GRADESCOPE_VISIBILITY = {"public": "visible", "hidden": "after_published"}
TEST_OUTPUT_CAP = 2048          # characters of one test's output
REPORT_TEXT_CAP = 64 * 1024     # characters of all outputs of one results.json together



def gradescope_payload(result: SubmissionResult) -> dict:
    """Gradescope's results.json (top-level score, tests[] with per-test fields)."""
    tests = []
    for lab in result.labs:
        for t in lab.tests:
            tests.append({
                "name": f"{lab.name}: {t.name}",
                "name_format": "text",
                "score": round(t.score, 4),
                "max_score": round(t.max_score, 4),
                "status": t.status,
                "visibility": GRADESCOPE_VISIBILITY[t.visibility],
                "output": capped(_output_text(t), TEST_OUTPUT_CAP),
                "output_format": "text",
                "tags": [lab.name],
            })
    notes = [f"{lab.file}: {lab.message}" for lab in result.labs if lab.message]
    # The whole report stays small whatever the submission did: the tests' outputs first,
    # each cut to what is left of the budget, then the notes.
    budget = REPORT_TEXT_CAP
    for test in tests:
        test["output"] = capped(test["output"], max(0, budget))
        budget -= len(test["output"])
    overview = capped("\n".join(result.notes + notes), max(0, budget))
    return {
        "score": round(result.score, 4),
        "execution_time": round(result.execution_time, 3),
        "output": overview,
        "output_format": "text",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
        "extra_data": {"labs": {lab.name: {"score": round(lab.score, 4),
                                           "max_score": round(lab.max_score, 4),
                                           "status": lab.status} for lab in result.labs},
                       "status": result.status},
    }


def _output_text(t: TestResult) -> str:
    lines = [t.description] if t.description else []
    if not t.passed and t.message:
        lines.append(t.message)
    if not t.passed and t.diagnosis:
        lines.append(f"Diagnosis: {t.diagnosis}")
    return "\n".join(lines)


def write_gradescope(result: SubmissionResult, path: Path) -> None:
    atomic_write_text(path, json.dumps(gradescope_payload(result), indent=2) + "\n")
