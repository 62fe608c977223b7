"""The GitHub Classroom payload: a view of the result model for the Classroom reporter."""

from __future__ import annotations

import base64
import json

from grader.outputs.text import failure_text, printable
from grader.results import LabStatus, SubmissionResult

CLASSROOM_PAYLOAD_VERSION = 1



def _number(value: float) -> int | float:
    """Integral scores as ints (the Classroom reporter adds them up and prints them)."""
    return int(value) if float(value).is_integer() else round(float(value), 4)


def classroom_payload(result: SubmissionResult) -> dict:
    """The result in the shape the GitHub Classroom grading reporter reads from a runner.

    ``{"version": 1, "status": "pass"|"fail"|"error", "max_score": int, "tests": [{"name",
    "status", "score", "message"}]}``: the reporter sums ``tests[].score`` for the points it
    posts. A test of a lab that could not be graded (missing file, import error) is an
    ``error``; the whole payload is an ``error`` only when the grader itself failed.
    """
    tests = []
    for lab in result.labs:
        for t in lab.tests:
            if t.passed:
                status = "pass"
            else:
                status = "fail" if lab.status == LabStatus.GRADED else "error"
            tests.append({
                "name": printable(f"{lab.name}: {t.name}"),
                "status": status,
                "score": _number(t.score),
                "message": failure_text(t) if not t.passed else "",
            })
    if result.fault is not None:
        status = "error"
    else:
        status = "pass" if tests and all(t["status"] == "pass" for t in tests) else "fail"
    return {
        "version": CLASSROOM_PAYLOAD_VERSION,
        "status": status,
        "max_score": int(round(result.max_score)),
        "tests": tests,
    }


def classroom_encoded(result: SubmissionResult) -> str:
    """The payload as the reporter takes it: base64 of its UTF-8 JSON (one line)."""
    raw = json.dumps(classroom_payload(result), ensure_ascii=True, separators=(",", ":"))
    return base64.b64encode(raw.encode("utf-8")).decode("ascii")
