"""Views of a ``SubmissionResult`` for CI systems: JUnit XML and the GitHub Classroom payload.

Both are pure functions of the result model (grader/results.py). Text that came from student
code has already been capped and visibility-filtered by the engine; here it is also made
*printable* (no control characters, no lone surrogates), because XML 1.0 cannot carry most
control characters at all and a CI log should not be repainted by escape sequences.
"""

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET

from grader.results import SubmissionResult, TestResult

# C0/C1 control characters except tab and newline, DEL, lone surrogates, and the two code
# points XML 1.0 forbids outright.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")

CLASSROOM_PAYLOAD_VERSION = 1


def printable(text: str) -> str:
    """``text`` with control characters and lone surrogates replaced by U+FFFD."""
    return _UNPRINTABLE.sub("\ufffd", str(text).replace("\r\n", "\n").replace("\r", "\n"))


def failure_text(test: TestResult) -> str:
    """What a failing test tells the student: the filtered message and any diagnosis."""
    lines = [test.message] if test.message else []
    if test.diagnosis:
        lines.append(f"Diagnosis: {test.diagnosis}")
    return printable("\n".join(lines))


# --------------------------------------------------------------------------------------
# JUnit XML
# --------------------------------------------------------------------------------------


def _seconds(value: float) -> str:
    return f"{max(0.0, float(value)):.3f}"


def junit_xml(result: SubmissionResult) -> str:
    """JUnit XML: one ``<testsuite>`` per lab, one ``<testcase classname=lab name=test>`` each.

    A failing test has a ``<failure>`` whose ``message`` is the first line of its (already
    visibility-filtered) message and whose text is the whole message; ``type`` says why
    (``failed``, or the lab's status when the file was missing or did not import).
    """
    root = ET.Element("testsuites", {
        "name": printable(result.submission),
        "tests": str(sum(len(lab.tests) for lab in result.labs)),
        "failures": str(sum(not t.passed for lab in result.labs for t in lab.tests)),
        "errors": "0",
        "time": _seconds(result.execution_time),
    })
    for lab in result.labs:
        suite = ET.SubElement(root, "testsuite", {
            "name": lab.name,
            "tests": str(len(lab.tests)),
            "failures": str(sum(not t.passed for t in lab.tests)),
            "errors": "0",
            "skipped": "0",
            "time": _seconds(sum(t.duration_s for t in lab.tests)),
        })
        props = ET.SubElement(suite, "properties")
        for name, value in (("title", lab.title), ("file", lab.file), ("status", lab.status),
                            ("score", f"{lab.score:g}"), ("max_score", f"{lab.max_score:g}")):
            ET.SubElement(props, "property", {"name": name, "value": printable(value)})
        for t in lab.tests:
            case = ET.SubElement(suite, "testcase", {
                "classname": lab.name, "name": t.name, "time": _seconds(t.duration_s)})
            if not t.passed:
                text = failure_text(t) or "failed"
                failure = ET.SubElement(case, "failure", {
                    "message": text.splitlines()[0] if text else "failed",
                    "type": "failed" if lab.status == "graded" else lab.status,
                })
                failure.text = text
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# --------------------------------------------------------------------------------------
# GitHub Classroom
# --------------------------------------------------------------------------------------


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
                status = "fail" if lab.status == "graded" else "error"
            tests.append({
                "name": printable(f"{lab.name}: {t.name}"),
                "status": status,
                "score": _number(t.score),
                "message": failure_text(t) if not t.passed else "",
            })
    if result.status != "ok":
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
