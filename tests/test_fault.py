"""Whose fault it is, as a type (#24 item 1): every output reads a result's ``fault``, and no
module decides by a status's or message's text."""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

from grader.outputs.class_page import student_record
from grader.outputs.gradebook import build_gradebook, failed_result
from grader.outputs.gradescope import gradescope_payload, write_gradescope
from grader.outputs.html import render_feedback_html
from grader.results import Fault, LabResult, SubmissionResult
from grader.rubric import load_rubric
from grader import paths

PACKAGE = Path(__file__).resolve().parent.parent / "grader"
# Words that once decided whose fault a result was (statuses and messages of the grader's
# faults, and the list a "missing" message ends with).
FAULT_WORDS = ("grader error", "grading failed", "not graded", "not finished", "sandbox error",
               "timed out", "rejected zip", "Files found", "ok")
TEXT_TESTS = {"startswith", "endswith", "split", "rsplit", "partition", "rpartition", "find",
              "index", "removeprefix"}
ODD = "the moon is in the wrong phase"        # a grader fault's message that names nothing


def _string_constants() -> dict[str, list[str]]:
    """Module-level NAME = "text" (or a tuple of texts) of the package, so that a test by a
    named prefix is found too."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign):
                texts = _texts(node.value, {})
                for target in node.targets:
                    if texts and isinstance(target, ast.Name):
                        found[target.id] = texts
    return found


def _texts(node: ast.AST, constants: dict[str, list[str]]) -> list[str]:
    """The strings ``node`` stands for: a literal, a named constant, a tuple of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [t for v in node.values for t in _texts(v, constants)]
    if isinstance(node, ast.FormattedValue):
        return _texts(node.value, constants)
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    if isinstance(node, ast.Attribute) and node.attr in constants:
        return constants[node.attr]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [t for e in node.elts for t in _texts(e, constants)]
    return []


def _fault_word(texts: list[str], *, ok: bool = True) -> str | None:
    """The first fault word a text starts with (``ok``: whole texts "ok" count too)."""
    for text in texts:
        for word in FAULT_WORDS:
            if word == "ok":
                if ok and text == "ok":
                    return word
            elif text.strip().lower().startswith(word.lower()):
                return word
    return None


def test_no_module_decides_by_a_status_or_message_text():
    constants = _string_constants()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "results.py" and path.parent == PACKAGE:
            continue                  # the one place that reads old files' statuses
        if "suites" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in TEXT_TESTS:
                word = _fault_word([t for a in node.args for t in _texts(a, constants)])
                if word:
                    found.append(f"{where}: .{node.func.attr}({word!r})")
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                equal = any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops)
                if equal or any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                    # ("ok" in reply: a protocol reply's key, not a status)
                    word = _fault_word([t for s in sides for t in _texts(s, constants)],
                                       ok=equal)
                    if word:
                        found.append(f"{where}: compares with {word!r}")
    assert not found, ("whose fault it is is decided by text; read the result's fault "
                       "(grader.results.Fault) instead:\n" + "\n".join(found))


def _grader_fault(rubric, student="gil") -> SubmissionResult:
    return failed_result(student, rubric, ODD, Fault.GRADER)


def test_a_grader_fault_with_any_message_is_a_grader_fault_in_results_json():
    rubric = load_rubric((paths.KIT / "rubric.yaml"))
    payload = gradescope_payload(_grader_fault(rubric))
    assert payload["extra_data"]["fault"] == "grader"
    assert {lab["fault"] for lab in payload["extra_data"]["labs"].values()} == {"grader"}
    # a student's missing file is the student's, with the same words or none
    lab = LabResult(name="lab1_attention", title="", file="lab1_attention.py",
                    status="missing", message=ODD)
    student = gradescope_payload(SubmissionResult("ada", labs=[lab]))
    assert student["extra_data"]["fault"] is None
    assert student["extra_data"]["labs"]["lab1_attention"]["fault"] == "student"


def test_the_class_page_and_gradebook_read_the_fault_not_the_words(tmp_path):
    rubric = load_rubric((paths.KIT / "rubric.yaml"))
    write_gradescope(_grader_fault(rubric, "gil"), tmp_path / "gil" / "results.json")
    (tmp_path / "gil").mkdir(exist_ok=True)
    refused = failed_result("zed", rubric, ODD, Fault.STUDENT)
    write_gradescope(refused, tmp_path / "zed" / "results.json")
    data = json.loads((tmp_path / "gil" / "results.json").read_text())
    assert student_record("gil", data, has_feedback=False).fault is Fault.GRADER
    book = build_gradebook(out=tmp_path, students=["gil", "zed"], rubric=rubric, plots=False)
    page = (tmp_path / "class.html").read_text()
    faults = page.split('id="faults"')[1].split("</ul>")[0]
    problems = page.split('id="submission-problems"')[1].split("</ul>")[0]
    assert "gil" in faults and "zed" not in faults, faults
    assert "zed" in problems and "gil" not in problems, problems
    # the grader's fault is no score: left out of the distribution, the student's zero is in
    assert book.summary["students"] == 2
    assert "1 student(s) the grader failed to grade are left out" in page
    with open(tmp_path / "grades.csv", newline="") as fh:
        rows = {r["student"]: r for r in csv.DictReader(fh)}
    assert rows["gil"]["status"] == ODD and rows["zed"]["status"] == ODD


def test_feedback_says_the_grader_failed_whatever_the_words():
    rubric = load_rubric((paths.KIT / "rubric.yaml"))
    page = render_feedback_html(_grader_fault(rubric))
    assert ODD in page and "not your code's doing" in page
    refused = render_feedback_html(failed_result("zed", rubric, ODD, Fault.STUDENT))
    assert ODD in refused and "not your code's doing" not in refused


def test_a_grader_fault_on_one_lab_is_retried_with_a_fresh_grader_on_gradescope(
        tmp_path, monkeypatch):
    """One recovery for every route (#24 item 2): a fault of the grader's own while a lab is
    graded is tried once more with a fresh Grader, as a batch does (``pool.grade_with_retry``).
    On Gradescope the lab used to stay "Not graded: the grader failed" for a fault that a
    second try grades."""
    import shutil

    from grader.autograder.gradescope import RunnerConfig, run
    from grader.grading import Grader

    root = tmp_path / "autograder"
    (root / "results").mkdir(parents=True)
    shutil.copytree(paths.KIT, root / "source", ignore=shutil.ignore_patterns(
        ".git", ".venv", "tests", "docs", "benchmarks", "__pycache__", "*.egg-info"))
    (root / "submission").mkdir()
    shutil.copyfile(paths.KIT / "solutions" / "lab1_attention.py",
                    root / "submission" / "lab1_attention.py")
    original, graders = Grader.grade, []

    def grade_failing_in_the_first_grader(self, *args, **kwargs):
        if not graders or graders[0] is self:
            graders[:1] = [self]
            raise RuntimeError("the grader's pytest session broke (a transient fault)")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Grader, "grade", grade_failing_in_the_first_grader)
    assert run(RunnerConfig(root=root, labs=["lab1_attention"], timeout_s=600)) == 0
    payload = json.loads((root / "results" / "results.json").read_text())
    assert payload["score"] == load_rubric(paths.KIT / "rubric.yaml").labs[
        "lab1_attention"].max_points, payload
    assert all(t["status"] == "passed" for t in payload["tests"]), payload["tests"]


def test_the_one_recovery_tries_once_more_with_a_fresh_grader_and_keeps_no_broken_one():
    """``retry_with_a_fresh_grader``, which a batch and Gradescope share: a grader fault is
    tried again once on a fresh Grader; a second fault is final; a Grader that failed is
    closed without waiting and never handed back."""
    from grader.grading import retry_with_a_fresh_grader

    class FakeGrader:
        made = 0

        def __init__(self):
            FakeGrader.made += 1
            self.number, self.closed = FakeGrader.made, None

        def close(self, wait=True):
            self.closed = wait

    def run(faults: int):
        FakeGrader.made = 0
        seen = []

        def attempt(g):
            seen.append(g)
            return "fault" if len(seen) <= faults else "graded"

        outcome, kept = retry_with_a_fresh_grader(FakeGrader(), FakeGrader, attempt,
                                                  lambda o: o == "fault")
        return outcome, kept, seen

    outcome, kept, seen = run(faults=0)
    assert (outcome, [g.number for g in seen], kept.number, kept.closed) == ("graded", [1], 1, None)
    outcome, kept, seen = run(faults=1)
    assert (outcome, [g.number for g in seen], kept.number) == ("graded", [1, 2], 2)
    assert seen[0].closed is False and kept.closed is None
    outcome, kept, seen = run(faults=2)
    assert (outcome, [g.number for g in seen], kept.number) == ("fault", [1, 2], 3)
    assert [g.closed for g in seen] == [False, False] and kept.closed is None
