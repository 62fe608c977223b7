"""Tests of grader/outputs/reports.py: JUnit XML and the GitHub Classroom payload.

Each view is checked against the result it was made from: on a hand-built result with
awkward text (control characters, XML markup, a lone surrogate) and on a real grading.
"""

from __future__ import annotations

import base64
import json
import xml.etree.ElementTree as ET

import pytest

from helpers import grade, make_submission
from grader.cli import main
from grader.outputs.classroom import classroom_encoded, classroom_payload
from grader.outputs.junit import junit_xml
from grader.outputs.text import failure_text, printable
from grader.results import LabResult, SubmissionResult
from grader.results import TestResult as CaseResult  # not "Test*": pytest would collect it

NASTY = 'expected 1.0 "}]} <failure> ]]> & \x00\x07\x1b[31m red \r\n\udcff end'


def _made_up_result() -> SubmissionResult:
    lab1 = LabResult(name="lab1_attention", title="Scaled dot-product attention",
                     file="lab1_attention.py")
    lab1.tests = [
        CaseResult(lab="lab1_attention", name="test_public_ok", description="works",
                   visibility="public", max_score=2, passed=True, duration_s=0.25),
        CaseResult(lab="lab1_attention", name="test_public_bad", description="",
                   visibility="public", max_score=3, passed=False, message=NASTY,
                   diagnosis="softmax over the wrong axis", duration_s=0.5),
        CaseResult(lab="lab1_attention", name="test_hidden_bad", description="",
                   visibility="hidden", max_score=1.5, passed=False,
                   message="weights: wrong values (likely cause: the mask is inverted)"),
    ]
    lab2 = LabResult(name="lab2_multihead", title="Multi-head attention",
                     file="lab2_multihead.py", status="missing",
                     message="lab2_multihead.py was not found in the submission")
    lab2.tests = [CaseResult(lab="lab2_multihead", name="test_split", description="",
                             visibility="public", max_score=4, passed=False,
                             message=lab2.message)]
    return SubmissionResult(submission="alice", labs=[lab1, lab2], execution_time=1.5)



def test_to_dict_without_timings_drops_the_timings_only():
    result = _made_up_result()
    result.execution_time = 1.5
    full, plain = result.to_dict(), result.to_dict_without_timings()
    assert "execution_time" not in plain
    assert all("duration_s" not in t for lab in plain["labs"] for t in lab["tests"])
    # Everything else is kept: put the timings back and it is the whole dict again.
    plain["execution_time"] = full["execution_time"]
    for lab, full_lab in zip(plain["labs"], full["labs"], strict=False):
        for test, full_test in zip(lab["tests"], full_lab["tests"], strict=False):
            test["duration_s"] = full_test["duration_s"]
    assert plain == full

def test_printable_keeps_text_and_newlines_but_no_control_characters():
    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable("x\r\ny\rz") == "x\ny\nz"
    cleaned = printable(NASTY)
    assert "\x00" not in cleaned and "\x1b" not in cleaned and "\udcff" not in cleaned
    assert '"}]} <failure> ]]> &' in cleaned and "red" in cleaned
    cleaned.encode("utf-8")  # no lone surrogate left


# --------------------------------------------------------------------------------------
# JUnit
# --------------------------------------------------------------------------------------


def test_junit_mirrors_the_result_test_by_test():
    result = _made_up_result()
    root = ET.fromstring(junit_xml(result).encode("utf-8"))
    assert root.tag == "testsuites"
    assert int(root.get("tests")) == 4 and int(root.get("failures")) == 3
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["lab1_attention", "lab2_multihead"]
    for suite, lab in zip(suites, result.labs, strict=False):
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases) == len(lab.tests)
        assert int(suite.get("failures")) == sum(not t.passed for t in lab.tests)
        props = {p.get("name"): p.get("value") for p in suite.find("properties")}
        assert props["score"] == f"{lab.score:g}" and props["max_score"] == f"{lab.max_score:g}"
        for case, t in zip(cases, lab.tests, strict=False):
            assert (case.get("classname"), case.get("name")) == (lab.name, t.name)
            assert float(case.get("time")) == pytest.approx(t.duration_s, abs=1e-3)
            failure = case.find("failure")
            assert (failure is None) == t.passed
            if failure is not None:
                assert failure.text == failure_text(t)
                assert failure.get("message") == failure_text(t).splitlines()[0]


def test_junit_failure_carries_only_the_filtered_message_and_escapes_everything():
    result = _made_up_result()
    root = ET.fromstring(junit_xml(result).encode("utf-8"))
    cases = {c.get("name"): c for c in root.iter("testcase")}
    hidden = cases["test_hidden_bad"].find("failure")
    assert hidden.text == "weights: wrong values (likely cause: the mask is inverted)"
    assert hidden.get("type") == "failed"
    nasty = cases["test_public_bad"].find("failure")
    assert '"}]} <failure> ]]> &' in nasty.text
    assert "Diagnosis: softmax over the wrong axis" in nasty.text
    assert cases["test_split"].find("failure").get("type") == "missing"
    assert cases["test_public_ok"].find("failure") is None


# --------------------------------------------------------------------------------------
# GitHub Classroom
# --------------------------------------------------------------------------------------


def _decode(encoded: str) -> dict:
    return json.loads(base64.b64decode(encoded, validate=True).decode("utf-8"))


def check_payload(payload: dict, result: SubmissionResult) -> None:
    assert set(payload) == {"version", "status", "max_score", "tests"}
    assert payload["version"] == 1
    assert isinstance(payload["max_score"], int)
    assert payload["max_score"] == round(result.max_score)
    tests = [(lab, t) for lab in result.labs for t in lab.tests]
    assert len(payload["tests"]) == len(tests)
    for entry, (lab, t) in zip(payload["tests"], tests, strict=False):
        assert set(entry) == {"name", "status", "score", "message"}
        assert entry["name"] == f"{lab.name}: {t.name}"
        assert entry["score"] == t.score
        expected = "pass" if t.passed else ("fail" if lab.status == "graded" else "error")
        assert entry["status"] == expected
        assert entry["message"] == ("" if t.passed else failure_text(t))
    # The reporter adds up tests[].score for the points it posts.
    assert sum(e["score"] for e in payload["tests"]) == pytest.approx(result.score)


def test_classroom_payload_matches_a_made_up_result():
    result = _made_up_result()
    encoded = classroom_encoded(result)
    assert encoded.isascii() and "\n" not in encoded
    payload = _decode(encoded)
    assert payload == classroom_payload(result)
    check_payload(payload, result)
    assert payload["status"] == "fail"
    assert payload["max_score"] == 10  # 2 + 3 + 1.5 + 4 = 10.5, an integer for Classroom
    assert [e["score"] for e in payload["tests"]] == [2, 0, 0, 0]
    assert isinstance(payload["tests"][0]["score"], int)


def test_classroom_status_pass_and_error():
    result = _made_up_result()
    for lab in result.labs:
        lab.status = "graded"
        for t in lab.tests:
            t.passed = True
    assert classroom_payload(result)["status"] == "pass"
    result.status = "grader error: a suite failed to load"
    assert classroom_payload(result)["status"] == "error"


@pytest.fixture(scope="module")
def graded(rubric, zygote, tmp_path_factory):
    """A real grading of a one-bug submission (lab1 only, public and hidden tests)."""
    sub = make_submission("bug_softmax_dim", tmp_path_factory.mktemp("sub") / "bug")
    return sub, grade(sub, rubric=rubric, labs=["lab1_attention"], zygote=zygote)


def test_views_of_a_real_grading(graded):
    _, result = graded
    assert any(t.passed for t in result.labs[0].tests)
    assert any(not t.passed for t in result.labs[0].tests)
    check_payload(_decode(classroom_encoded(result)), result)
    root = ET.fromstring(junit_xml(result))
    assert int(root.get("failures")) == sum(not t.passed for t in result.labs[0].tests)
    assert [c.get("name") for c in root.iter("testcase")] == [t.name for t in result.labs[0].tests]


def test_classroom_command_prints_writes_and_sets_the_github_output(graded, tmp_path, capsys,
                                                                    monkeypatch):
    sub, result = graded
    github_output = tmp_path / "github_output"
    github_output.write_text("earlier=1\n")
    monkeypatch.setenv("GITHUB_OUTPUT", str(github_output))
    out = tmp_path / "payload.json"
    status = main(["classroom", str(sub), "--lab", "lab1_attention", "--out", str(out),
                   "--github-output"])
    assert status == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    lines = github_output.read_text().splitlines()
    assert lines[0] == "earlier=1" and lines[1] == f"result={printed}"
    payload = _decode(printed)
    assert payload == json.loads(out.read_text())
    check_payload(payload, result)  # the same grading, through the command
    assert payload["status"] == "fail"


def test_classroom_github_output_needs_the_variable(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GITHUB_OUTPUT", raising=False)
    assert main(["classroom", str(tmp_path), "--github-output"]) == 2
    assert "GITHUB_OUTPUT" in capsys.readouterr().err


def test_grade_format_junit_writes_results_xml(graded, tmp_path):
    sub, result = graded
    assert main(["grade", str(sub), "--lab", "lab1_attention", "--out", str(tmp_path),
                 "--format", "junit"]) == 0
    root = ET.parse(tmp_path / "results.xml").getroot()
    assert [(c.get("classname"), c.get("name"), c.find("failure") is None)
            for c in root.iter("testcase")] == \
        [("lab1_attention", t.name, t.passed) for t in result.labs[0].tests]
    assert (tmp_path / "results.json").is_file()


def test_results_json_stays_small_whatever_the_messages():
    """2 kB per test's output and 64 kB for the whole report, whatever a result holds."""
    from grader.outputs.gradescope import REPORT_TEXT_CAP, TEST_OUTPUT_CAP, gradescope_payload

    lab = LabResult(name="lab1_attention", title="t", file="lab1_attention.py",
                    message="m" * 100_000)
    for i in range(200):
        lab.tests.append(CaseResult(lab=lab.name, name=f"test_{i}", description="d",
                                    visibility="hidden", max_score=1, passed=False,
                                    message="x" * 50_000, diagnosis="y" * 50_000))
    result = SubmissionResult(submission="s", labs=[lab], notes=["n" * 100_000])
    payload = gradescope_payload(result)
    outputs = [t["output"] for t in payload["tests"]]
    assert len(outputs) == 200 and all(len(o) <= TEST_OUTPUT_CAP for o in outputs)
    assert sum(map(len, outputs)) + len(payload["output"]) <= REPORT_TEXT_CAP
    assert outputs[0].endswith("(cut off)")
    assert len(json.dumps(payload)) < 2 * REPORT_TEXT_CAP


# --------------------------------------------------------------------------------------
# a lab not handed in: one line, not a table of failures (#29)
# --------------------------------------------------------------------------------------


def _missing_labs_result(n_tests: int = 24) -> SubmissionResult:
    """Lab 1 handed in, labs 2 and 3 missing (each with its tests, every one failed with the
    lab's message, as the grader records them)."""
    result = _made_up_result()
    lab2 = result.lab("lab2_multihead")
    lab2.tests = [CaseResult(lab=lab2.name, name=f"test_{i}", description="", visibility=v,
                             max_score=1, passed=False, message=lab2.message)
                  for i, v in enumerate(["public", "hidden"] * (n_tests // 2))]
    lab3 = LabResult(name="lab3_positional", title="Positional encodings",
                     file="lab3_positional.py", status="missing",
                     message="lab3_positional.py was not found in the submission")
    lab3.tests = [CaseResult(lab=lab3.name, name=f"test_{i}", description="",
                             visibility="public", max_score=2, passed=False,
                             message=lab3.message) for i in range(n_tests)]
    result.labs.append(lab3)
    return result


def test_a_missing_lab_is_one_line_in_every_view():
    import io
    import re as _re

    from rich.console import Console

    from grader.outputs.gradescope import gradescope_payload
    from grader.outputs.html import render_feedback_html
    from grader.outputs.terminal import render_table

    result = _missing_labs_result()
    out = io.StringIO()
    render_table(result, console=Console(file=out, width=200))
    text = out.getvalue()
    assert text.count("was not found in the submission") == 2, text
    assert "test_23" not in text                     # no rows of a missing lab
    assert "lab2_multihead - Multi-head attention: 0/24: not handed in" in text
    assert _re.search(r"Total: 2/78.5 .*handed in: lab1_attention \(1 of 3 labs\); "
                      r"not handed in: lab2_multihead, lab3_positional", text), text

    page = render_feedback_html(result)
    assert page.count("was not found in the submission") == 2
    assert 'data-test="test_23"' not in page
    assert "not handed in: lab2_multihead, lab3_positional" in page

    payload = gradescope_payload(result)
    missing = [t for t in payload["tests"] if "lab2" in t["name"] or "lab3" in t["name"]]
    assert [(t["name"], t["max_score"], t["score"]) for t in missing] == [
        ("lab2_multihead: not handed in", 24, 0), ("lab3_positional: not handed in", 48, 0)]
    assert all("was not found" in t["output"] for t in missing)
    assert sum(t["max_score"] for t in payload["tests"]) == result.max_score
    assert "not handed in: lab2_multihead, lab3_positional" in payload["output"]
