"""Every CSV the grader writes is safe to open in a spreadsheet (issue #28): a student id
taken from a folder or zip name, or any other text cell, never becomes a live formula,
numbers stay numbers, and the same names stay plain text in class.html and feedback.html."""

from __future__ import annotations

import csv
import html
import io

import pytest

from grader.outputs import spreadsheet
from grader.outputs.gradebook import build_gradebook, failed_result
from grader.results import Fault, LabStatus
from grader.outputs.gradescope import write_gradescope
from grader.outputs.html import render_feedback_html
from grader.outputs.text import printable

# Student ids a folder or zip name can carry (tabs and carriage returns included), each a
# formula or the start of one in some spreadsheet; and a separator a locale may split on.
HOSTILE_IDS = [
    '=HYPERLINK("http://x.example","click")',
    "+SUM(1,1)",
    "@SUM(1,1)",
    "-1+1",
    "\t=1+1",
    "\r=1+1",
    " =1+1",
    "=cmd|' /C calc'!A0",
]
# Safe only because the field is quoted: an importer that splits on ";" or a tab would
# otherwise start a cell at "=".
SPLIT_IDS = ["alice;=1+1", "bob\t=1+1"]
PLAIN_IDS = ["ada", "o'brien", "a,b", 'say "hi"', "élodie", "1+1"]


def _quoted_fields(line: str) -> list[tuple[bool, str]]:
    """(was the field quoted, its raw text) for each field of one CSV line without
    newlines inside fields."""
    fields, i = [], 0
    while i <= len(line):
        if line[i:i + 1] == '"':
            j, text = i + 1, ""
            while True:
                k = line.index('"', j)
                text += line[j:k]
                if line[k + 1:k + 2] == '"':
                    text, j = text + '"', k + 2
                    continue
                break
            fields.append((True, text))
            i = k + 2
        else:
            k = line.find(",", i)
            k = len(line) if k < 0 else k
            fields.append((False, line[i:k]))
            i = k + 1
    return fields


@pytest.mark.parametrize("value", HOSTILE_IDS)
def test_a_formula_text_cell_is_neutralised(value):
    cell = spreadsheet.text_cell(value)
    assert cell == "'" + value                   # shown as text, nothing of it lost


@pytest.mark.parametrize("value", PLAIN_IDS + SPLIT_IDS + ["", "'=already quoted"])
def test_other_text_is_unchanged(value):
    assert spreadsheet.text_cell(value) == value


def test_numbers_stay_numbers_and_text_is_quoted():
    out = io.StringIO()
    writer = spreadsheet.writer(out)
    writer.writerow(["-1+1", spreadsheet.number_cell(-1.5), spreadsheet.number_cell(12.0),
                     spreadsheet.number_cell(13 / 3), 0, "ok"])
    line = out.getvalue().rstrip("\r\n")
    assert line == '"\'-1+1",-1.5,12,4.3333,0,"ok"'
    with pytest.raises(TypeError, match="text or a number"):
        writer.writerow([None])
    with pytest.raises(TypeError, match="text or a number"):
        writer.writerow([True])


def test_grades_csv_cells_are_safe_and_names_stay_plain_in_the_html(tmp_path, rubric):
    """The gradebook of a class whose ids (and one status) are formulas: grades.csv neutralises
    every text cell and quotes it, keeps every number a bare number, and class.html and
    feedback.html show each name exactly as it is, HTML-escaped, with no quote added."""
    out = tmp_path / "out"
    students = HOSTILE_IDS + SPLIT_IDS + PLAIN_IDS
    status = "=HYPERLINK(\"http://x.example\",\"status\")"
    for i, student in enumerate(students):
        result = failed_result(student, rubric, status if i == 0 else "ok", Fault.STUDENT)
        if i:                                  # the others pass every test of lab 1
            result.status, result.fault = "ok", None
            for lab in result.labs:
                lab.status, lab.fault = LabStatus.GRADED, None
                for t in lab.tests:
                    t.passed = lab.name == "lab1_attention"
        write_gradescope(result, out / student / "results.json")
        (out / student / "feedback.html").write_text(render_feedback_html(result),
                                                     encoding="utf-8")
    build_gradebook(out=out, students=students, rubric=rubric, plots=False)

    text = (out / "grades.csv").read_bytes().decode("utf-8")     # \r kept as written
    rows = list(csv.reader(io.StringIO(text, newline="")))
    header, body = rows[0], rows[1:]
    assert header == ["student", *rubric.labs, "total", "max_total", "status"]
    assert [r[0] for r in body] == [spreadsheet.text_cell(s) for s in students]
    for row in body:
        for cell in row:                       # nothing a spreadsheet would evaluate
            assert not cell.lstrip(" \t\r\n").startswith(("=", "+", "-", "@")) \
                or cell.startswith("'"), cell
    assert body[0][-1] == "'" + status
    full_lab1 = rubric.labs["lab1_attention"].max_points
    assert float(body[1][1]) == full_lab1 and float(body[1][-3]) == full_lab1
    # Raw lines: text fields quoted, number fields bare.
    lines = text.split("\r\n")[1:-1]           # the writer ends every row with \r\n
    assert len(lines) == len(body)
    for line in lines:
        fields = _quoted_fields(line)
        assert [q for q, _ in fields] == [True] + [False] * (len(rubric.labs) + 2) + [True], line
        for _, number in fields[1:-1]:
            float(number)

    page = (out / "class.html").read_bytes().decode("utf-8")
    for student in students:
        # class.html shows control characters as U+FFFD (grader.outputs.text.printable)
        shown = html.escape(printable(student))
        assert f">{shown}</a>" in page, student       # the link to the feedback, as text
        assert html.escape(spreadsheet.text_cell(student)) not in page or \
            spreadsheet.text_cell(student) == student
        feedback = (out / student / "feedback.html").read_bytes().decode("utf-8")
        assert f"<h1>Feedback for {html.escape(student)}</h1>" in feedback, student


def test_every_csv_the_grader_writes_goes_through_the_safe_writer():
    """No module of the grader but grader.outputs.spreadsheet builds a csv writer: a new
    CSV output must use spreadsheet.writer (and so escape its text cells)."""
    import ast
    from pathlib import Path

    import grader

    package = Path(grader.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == package / "outputs" / "spreadsheet.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            builds_writer = (isinstance(node, ast.Attribute)
                             and node.attr in ("writer", "DictWriter")
                             and isinstance(node.value, ast.Name) and node.value.id == "csv")
            imports_from_csv = isinstance(node, ast.ImportFrom) and node.module == "csv"
            if builds_writer or imports_from_csv:
                found.append(f"{path.relative_to(package)}:{node.lineno}")
    assert found == [], f"CSV written around grader.outputs.spreadsheet: {found}"
