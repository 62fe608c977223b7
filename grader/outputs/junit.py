"""JUnit XML: a view of the result model for CI systems (``grader grade --format junit``)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from grader.outputs.text import failure_text, printable
from grader.results import SubmissionResult



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
