"""Notebooks: the nbgrader course built from solutions/ (grader.notebooks), lab code extracted
from submitted notebooks (grader.intake.notebook, grading.sanitize), and the gradebook export
(grader.authoring.nbgrader_bridge).

The tests marked ``nbgrader`` run the real nbgrader end to end (generate_assignment, autograde,
generate_feedback, the Gradebook API) with a kernelspec in a temporary JUPYTER_PATH that points
at this interpreter; they are skipped only when nbgrader is not importable.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import grade as shared_grade
from grader import paths
from grader.course import Course
from grader.intake.notebook import (
    HIDDEN_TESTS_GRADE_ID,
    SCRATCH_CELL_MARKER,
    TEST_CELL_MARKER,
    Cell,
    NotebookError,
    extract_lab_source,
    given_imports,
    grade_cell_for,
    hidden_test_id,
    parse_notebook,
    grade_id_for,
)
from grader.authoring.course_notebooks import (course_drift, course_files, generate_assignments,
                                               private_jupyter_env, write_course)

# nbgrader is imported by the tests that use it, not at collection (~1.7 s of imports).
NBGRADER_MISSING = "" if importlib.util.find_spec("nbgrader") else \
    "nbgrader is not installed; pip install 'attention-labs[notebooks]'"


def Gradebook(db_url: str):
    """nbgrader's Gradebook on ``db_url`` (imported here: see NBGRADER_MISSING)."""
    from nbgrader.api import Gradebook as gradebook
    return gradebook(db_url)


def missing_entry() -> type[Exception]:
    from nbgrader.api import MissingEntry
    return MissingEntry

def needs_nbgrader(test):
    """nbgrader-marked (and so slow: tests/conftest.py), skipped without nbgrader."""
    skip = pytest.mark.skipif(bool(NBGRADER_MISSING), reason=NBGRADER_MISSING or "x")
    return pytest.mark.nbgrader(skip(test))

FIXTURES = Path(__file__).parent / "fixtures"
NB_FIXTURES = FIXTURES / "notebooks"
LAB1 = "lab1_attention"
LAB2 = "lab2_multihead"


def _nb(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _src(cell: dict) -> str:
    s = cell["source"]
    return s if isinstance(s, str) else "".join(s)


def _meta(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _write_nb(nb: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    return path


def _code_cell(source: str, outputs=None, metadata=None) -> dict:
    return {"cell_type": "code", "execution_count": None, "metadata": metadata or {},
            "outputs": outputs or [], "source": source}


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    out = tmp_path_factory.mktemp("course")
    write_course(out, Course(paths.KIT))
    return out


# ======================================================================================
# The course builder
# ======================================================================================


def test_course_has_one_assignment_per_lab_with_rubric_points(course, rubric):
    assert (course / "nbgrader_config.py").is_file()
    for lab, spec in rubric.labs.items():
        nb = _nb(course / "source" / lab / f"{lab}.ipynb")
        assert nb["nbformat"] == 4 and nb["metadata"]["kernelspec"]["language"] == "python"
        ids = [_meta(c)["grade_id"] for c in nb["cells"] if _meta(c)]
        assert len(ids) == len(set(ids)), "grade ids must be unique"
        tests = [c for c in nb["cells"] if _meta(c).get("grade")]
        # one test cell per public rubric test, worth the rubric's points, and one cell for
        # all hidden tests, worth their sum (nbgrader's partial credit gives what passed)
        hidden = {n: t for n, t in spec.tests.items() if t.visibility == "hidden"}
        assert len(tests) == len(spec.tests) - len(hidden) + 1
        assert sum(_meta(c)["points"] for c in tests) == pytest.approx(spec.max_points)
        by_id = {_meta(c)["grade_id"]: _meta(c)["points"] for c in tests}
        for name, t in spec.tests.items():
            if t.visibility == "public":
                assert by_id[grade_id_for(lab, name, t.visibility)] == t.points
        assert by_id[HIDDEN_TESTS_GRADE_ID] == pytest.approx(sum(t.points for t in hidden.values()))
        for c in nb["cells"]:
            m = _meta(c)
            if not m:     # text, or the scratch cell (never graded)
                assert c["cell_type"] == "markdown" or _src(c).startswith(SCRATCH_CELL_MARKER)
                continue
            assert m["schema_version"] == 3 and m["grade_id"]
            if m["solution"]:
                assert m == {"grade": False, "solution": True, "locked": False,
                             "grade_id": m["grade_id"], "schema_version": 3}
                assert "### BEGIN SOLUTION" in _src(c) and "### END SOLUTION" in _src(c)
                assert "# TODO(Lab " in _src(c)
            elif m["grade"]:
                assert m["locked"] and not m["solution"] and TEST_CELL_MARKER in _src(c)
        # the cell before the tests is a solution cell, so nbgrader can put back a deleted test
        first_test = next(i for i, c in enumerate(nb["cells"]) if _meta(c).get("grade"))
        before = [c for c in nb["cells"][:first_test] if _meta(c)]
        assert _meta(before[-1])["solution"]


def test_lesson_and_code_come_from_the_solution(course, rubric):
    for lab, spec in rubric.labs.items():
        nb = _nb(course / "source" / lab / f"{lab}.ipynb")
        source = ((paths.KIT / "solutions") / spec.file).read_text(encoding="utf-8")
        tree = ast.parse(source)
        doc = ast.get_docstring(tree)
        assert nb["cells"][0]["cell_type"] == "markdown"
        assert doc.splitlines()[2] in _src(nb["cells"][0])
        code = "\n".join(_src(c) for c in nb["cells"] if c["cell_type"] == "code"
                         and not _meta(c).get("grade"))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                assert f"{'class' if isinstance(node, ast.ClassDef) else 'def'} {node.name}" in code
        # the instructor version, markers aside, is the reference code
        no_markers = "\n".join(ln for ln in code.splitlines()
                               if "### " not in ln and "# TODO(Lab" not in ln)
        ns: dict = {}
        if "from lab1_attention" not in no_markers:
            exec(compile(no_markers, lab, "exec"), ns)


def test_hidden_tests_are_hidden_in_the_source_notebook(course, rubric):
    for lab, spec in rubric.labs.items():
        text = (course / "source" / lab / f"{lab}.ipynb").read_text(encoding="utf-8")
        for name, t in spec.tests.items():
            if t.visibility == "hidden":
                assert name not in text, f"hidden test name {name} is in the notebook"
                assert hidden_test_id(lab, name) in text
        nb = _nb(course / "source" / lab / f"{lab}.ipynb")
        cells = [c for c in nb["cells"] if _meta(c).get("grade_id", "").startswith("hidden_")]
        assert [_meta(c)["grade_id"] for c in cells] == [HIDDEN_TESTS_GRADE_ID]
        lines = _src(cells[0]).splitlines()
        begin, end = lines.index("### BEGIN HIDDEN TESTS"), lines.index("### END HIDDEN TESTS")
        ids = [hidden_test_id(lab, n) for n, t in spec.tests.items() if t.visibility == "hidden"]
        inside, outside = "\n".join(lines[begin:end]), "\n".join(lines[:begin] + lines[end:])
        assert all(i in inside and i not in outside for i in ids)


def test_hidden_tests_are_one_collapsed_cell(course, rubric):
    """Eleven hidden-test placeholders were eleven cells: now one, shown collapsed, after
    the public tests, saying how many hidden tests and points it holds."""
    for lab, spec in rubric.labs.items():
        nb = _nb(course / "source" / lab / f"{lab}.ipynb")
        hidden = [t for t in spec.tests.values() if t.visibility == "hidden"]
        cell = next(c for c in nb["cells"] if _meta(c).get("grade_id") == HIDDEN_TESTS_GRADE_ID)
        assert nb["cells"][-1] is cell                          # after the public tests
        assert cell["metadata"]["jupyter"] == {"source_hidden": True}
        assert _meta(cell) == {"grade": True, "solution": False, "locked": True,
                               "points": sum(t.points for t in hidden),
                               "grade_id": HIDDEN_TESTS_GRADE_ID, "schema_version": 3}
        head = _src(cell).split("### BEGIN HIDDEN TESTS")[0]
        assert TEST_CELL_MARKER in head
        assert f"{len(hidden)} hidden tests, {sum(t.points for t in hidden):g} points" in head
        intro = next(_src(c) for c in nb["cells"] if _src(c).startswith("## Autograder tests"))
        assert f"{len(hidden)} hidden tests" in intro and "one cell" in intro.lower()


def test_a_scratch_cell_follows_the_code_and_is_never_graded(course, rubric, tmp_path):
    for lab in rubric.labs:
        nb = _nb(course / "source" / lab / f"{lab}.ipynb")
        i = next(i for i, c in enumerate(nb["cells"]) if SCRATCH_CELL_MARKER in _src(c))
        cell, before = nb["cells"][i], nb["cells"][i - 1]
        assert cell["cell_type"] == "code" and "nbgrader" not in cell["metadata"]
        assert "try things here" in _src(cell).lower() and "not graded" in _src(cell).lower()
        assert _meta(before).get("grade_id", "").startswith(("solution_", "given_"))
        assert _src(nb["cells"][i + 1]).startswith("## Autograder tests")
    # what a student writes there is left out of grading, definitions too
    scratch = (SCRATCH_CELL_MARKER + "\ndef causal_mask(n):\n    return None\n"
               "print(causal_mask(3))\n")
    cells = [_code_cell(_src(c)) for c in _nb(course / "source" / LAB1 / f"{LAB1}.ipynb")["cells"]
             if c["cell_type"] == "code" and not _meta(c).get("grade")]
    cells.insert(len(cells), _code_cell(scratch))
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    cells = parse_notebook(json.dumps(nb).encode(), name=f"{LAB1}.ipynb")
    assert cells[-1].test, "the scratch cell is left out like a test cell"
    got = extract_lab_source(cells, name=f"{LAB1}.ipynb",
                             prelude=given_imports(rubric.labs[LAB1].file, paths.KIT / "solutions"))
    assert "return None" not in got.source and "def causal_mask" in got.source


# What a notebook student does not have: the course's folders and files, the command line.
NOT_IN_A_NOTEBOOK = re.compile(
    r"exercises/|solutions/|tests/|docs/|suites|rubric\.yaml|LAB_CONTRACT|README"
    r"|grader (check|grade|stubs|validate)|\bpytest\b|\b[\w/]+\.py\b")


def test_notebooks_mention_no_file_a_notebook_student_lacks(course, rubric):
    for lab in rubric.labs:
        nb = _nb(course / "source" / lab / f"{lab}.ipynb")
        for c in nb["cells"]:
            for line in _src(c).splitlines():
                assert not NOT_IN_A_NOTEBOOK.search(line), f"{lab}: {line}"
    # nor what a cell says when an earlier lab's function is called before grading
    from grader.notebooks import provided_when_graded
    with pytest.raises(RuntimeError) as info:
        provided_when_graded(LAB1, "scaled_dot_product_attention")()
    assert not NOT_IN_A_NOTEBOOK.search(str(info.value)), str(info.value)
    assert "scratch cell" in str(info.value)


def test_drift_check_finds_missing_stale_and_extra(course, tmp_path):
    assert course_drift(course, Course(paths.KIT)) == []
    copy_ = tmp_path / "c"
    write_course(copy_, Course(paths.KIT))
    nb_path = copy_ / "source" / LAB1 / f"{LAB1}.ipynb"
    nb = _nb(nb_path)
    nb["cells"][0]["source"] = ["# edited by hand\n"]
    nb_path.write_text(json.dumps(nb, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    (copy_ / "source" / "lab2_multihead" / "lab2_multihead.ipynb").unlink()
    extra = copy_ / "source" / "lab9_extra" / "lab9_extra.ipynb"
    extra.parent.mkdir()
    extra.write_text("{}", encoding="utf-8")
    problems = course_drift(copy_, Course(paths.KIT))
    text = "\n".join(problems)
    assert f"{LAB1}.ipynb: stale" in text and "edited by hand" in text
    assert "lab2_multihead.ipynb: missing" in text
    assert "lab9_extra.ipynb: extra notebook" in text


def test_generation_is_deterministic(rubric):
    assert course_files(Course(paths.KIT, rubric)) == course_files(Course(paths.KIT, rubric))


def test_cli_notebooks_and_check(tmp_path):
    grader = [sys.executable, "-m", "grader.cli"]
    proc = subprocess.run([*grader, "notebooks", "--out", str(tmp_path), "--lab", LAB1],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "source" / LAB1 / f"{LAB1}.ipynb").is_file()
    proc = subprocess.run([*grader, "notebooks", "--out", str(tmp_path), "--lab", LAB1, "--check"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "in sync" in proc.stdout, proc.stdout + proc.stderr
    (tmp_path / "nbgrader_config.py").write_text("# changed\n")
    proc = subprocess.run([*grader, "notebooks", "--out", str(tmp_path), "--lab", LAB1, "--check"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "nbgrader_config.py: stale" in proc.stdout


def test_dependencies_are_shipped_only_on_request(rubric):
    lab2 = "lab2_multihead"
    assert f"source/{lab2}/lab1_attention.py" not in course_files(Course(paths.KIT, rubric), labs=[lab2])
    with_deps = course_files(Course(paths.KIT, rubric), labs=[lab2], include_dependencies=True)
    assert with_deps[f"source/{lab2}/lab1_attention.py"] == \
        ((paths.KIT / "solutions") / "lab1_attention.py").read_text(encoding="utf-8")
    nb = json.loads(course_files(Course(paths.KIT, rubric), labs=[lab2])[f"source/{lab2}/{lab2}.ipynb"])
    assert "This lab uses code of Lab 1" in _src(nb["cells"][1])
    with_deps_nb = json.loads(with_deps[f"source/{lab2}/{lab2}.ipynb"])
    assert "This lab uses code of Lab 1" not in _src(with_deps_nb["cells"][1])


# ======================================================================================
# Extracting lab code from notebooks
# ======================================================================================


def _cells(*sources: str) -> list[Cell]:
    return [Cell(label=f"code cell {i}", source=textwrap.dedent(s)) for i, s in enumerate(sources, 1)]


def _run(source: str) -> dict:
    ns: dict = {}
    exec(compile(source, "extracted", "exec"), ns)
    return ns


def test_last_definition_wins_and_reordering_is_fine():
    got = extract_lab_source(_cells(
        "def f():\n    return helper() + 1\n",
        "def helper():\n    return 1\n",
        "def f():\n    return helper() + 10\n",        # retyped later: this one counts
    ), name="nb")
    assert _run(got.source)["f"]() == 11


def test_experiments_are_left_out_and_definitions_kept():
    got = extract_lab_source(_cells(
        """
        import math
        import not_a_module_anywhere_xyz
        EPS = 1e-9
        TABLE = {"relu": abs}
        """,
        """
        def attention(x):
            return x * 2
        """,
        """
        q = 3
        out = attention(q)          # runs student code: left out
        print(out)                  # an expression: left out
        doubled = out * 2           # uses a left-out result: left out
        assert attention(1) == 5    # the student's own check: left out
        alias = attention
        alias(4)
        also = alias(5)
        """,
        """
        import torch.nn.functional as F
        ref = F.scaled_dot_product_attention  # names a forbidden API: left out
        """,
    ), name="nb", forbidden=("torch.nn.functional.scaled_dot_product_attention",))
    ns = _run(got.source)
    assert ns["attention"](2) == 4 and ns["EPS"] == 1e-9 and ns["q"] == 3
    assert "alias" in ns
    for gone in ("out", "doubled", "also", "ref"):
        assert gone not in ns
    assert "not_a_module_anywhere_xyz" not in got.source
    note = "\n".join(got.notes)
    assert "only definitions are graded" in note and "code cell 3 line 3 (runs your code)" in note
    assert "not_a_module_anywhere_xyz, which the grader does not have" in note
    assert "scaled_dot_product_attention, which the lab may not use" in note


def test_magics_shell_and_help_lines_are_left_out():
    got = extract_lab_source(_cells(
        "%matplotlib inline\nimport math\n!pip install nothing\nfiles = !ls\nmath.sqrt?\n",
        "%%bash\necho hello\n",
        "%%time\ndef g():\n    for i in range(2):\n        %time i\n    return 7\n",
    ), name="nb")
    ns = _run(got.source)
    assert ns["g"]() == 7 and "math" in ns
    assert "echo hello" not in got.source
    assert any("%%bash" in n for n in got.notes)
    assert any("IPython magics" in n for n in got.notes)


def test_cell_that_does_not_parse_is_left_out_with_a_note():
    got = extract_lab_source(_cells("def ok():\n    return 1\n", "def bad(:\n    pass\n"), name="nb")
    assert _run(got.source)["ok"]() == 1
    assert any("code cell 2 was left out: invalid syntax at its line 1" in n for n in got.notes)


def test_test_cells_are_left_out_by_metadata_and_marker():
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        _code_cell("x = 1\n"),
        _code_cell("assert x == 1\nx = 2\n",
                   metadata={"nbgrader": {"grade": True, "solution": False, "locked": True,
                                          "points": 1, "grade_id": "t", "schema_version": 3}}),
        _code_cell(f"{TEST_CELL_MARKER}\nx = 3\n"),
        _code_cell("from grader.notebooks import check\nx = 4\n"),
        {"cell_type": "markdown", "metadata": {}, "source": "x = 5"},
    ]}
    cells = parse_notebook(json.dumps(nb).encode(), name="t.ipynb")
    assert [c.test for c in cells] == [False, True, True, True]
    assert _run(extract_lab_source(cells, name="t.ipynb").source)["x"] == 1


def test_nothing_to_grade_and_invalid_json_are_clear():
    with pytest.raises(NotebookError, match="has no code to grade"):
        extract_lab_source([Cell("code cell 1", "   \n")], name="nb")
    data = (NB_FIXTURES / "broken_json" / "lab1_attention.ipynb").read_bytes()
    with pytest.raises(NotebookError, match=r"lab1_attention.ipynb is not a valid notebook: "
                                            r"Expecting ',' delimiter at line 7"):
        parse_notebook(data, name="lab1_attention.ipynb")
    with pytest.raises(NotebookError, match="not a valid notebook: expected a JSON object"):
        parse_notebook(b"[1, 2]", name="x.ipynb")
    with pytest.raises(NotebookError, match="not UTF-8"):
        parse_notebook(b'{"cells": "\xff"}', name="x.ipynb")


def test_nbformat3_notebook_is_read():
    data = (NB_FIXTURES / "nbformat3" / "lab1_attention.ipynb").read_bytes()
    cells = parse_notebook(data, name="lab1_attention.ipynb")
    got = extract_lab_source(cells, name="lab1_attention.ipynb")
    ns = _run(got.source)
    assert ns["causal_mask"](3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_given_imports_never_import_a_lab():
    assert given_imports("lab1_attention.py", paths.KIT / "solutions") == \
        "import math; import torch; import torch.nn.functional as F"
    line = given_imports("lab2_multihead.py", paths.KIT / "solutions")
    assert "torch.nn as nn" in line and "lab1" not in line
    assert given_imports("lab_missing.py", paths.KIT / "solutions") == ""


# ======================================================================================
# Grading notebook submissions (sanitize -> sandbox)
# ======================================================================================


def _notebook_from_py(py: str, *, split: bool = True) -> dict:
    """A student-style notebook: each top-level statement group in its own cell."""
    tree = ast.parse(py)
    lines = py.splitlines(keepends=True)
    cells = []
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    for i, node in enumerate(body):
        end = body[i + 1].lineno - 1 if i + 1 < len(body) else len(lines)
        cells.append(_code_cell("".join(lines[node.lineno - 1:end])))
    if not split:
        cells = [_code_cell("".join(_src(c) for c in cells))]
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}


def test_sanitize_takes_the_notebook_when_the_py_is_absent(tmp_path, rubric):
    from grader.intake import Problem, sanitize

    sub = tmp_path / "sub"
    _write_nb(_notebook_from_py(((paths.KIT / "solutions") / "lab1_attention.py").read_text()),
              sub / "nested" / "lab1_attention.ipynb")
    (sub / "lab3_positional.py").write_text(((paths.KIT / "solutions") / "lab3_positional.py").read_text())
    _write_nb(_notebook_from_py("x = 1\n"), sub / "lab3_positional.ipynb")   # the .py wins
    clean = sanitize(sub, rubric, [LAB1, "lab2_multihead", "lab3_positional"])
    assert "def scaled_dot_product_attention" in clean.files["lab1_attention.py"].decode()
    assert clean.files["lab3_positional.py"] == ((paths.KIT / "solutions") / "lab3_positional.py").read_bytes()
    assert clean.problems == {"lab2_multihead": Problem(
        "missing", "lab2_multihead.py was not found in the submission")}
    assert any(n.startswith("nested/lab1_attention.ipynb: graded as one file") for n in clean.notes)
    # one notebook file as the whole submission
    one = sanitize(sub / "nested" / "lab1_attention.ipynb", rubric, [LAB1, "lab3_positional"])
    assert "lab1_attention.py" in one.files and "lab3_positional" in one.problems


def test_sanitize_reports_an_invalid_notebook_per_lab(rubric):
    from grader.intake import sanitize

    clean = sanitize(NB_FIXTURES / "broken_json", rubric, [LAB1])
    assert clean.problems[LAB1].kind == "error"
    assert clean.problems[LAB1].message == ("lab1_attention.ipynb is not a valid notebook: Expecting ',' "
                                    "delimiter at line 7, column 3 (it is not JSON; was it saved by "
                                    "Jupyter?)")


def test_grade_messy_notebook_full_marks_and_one_bug_partial(tmp_path, rubric, zygote):

    solution = ((paths.KIT / "solutions") / "lab1_attention.py").read_text()
    nb = _notebook_from_py(solution)
    # reorder, delete the import cell, add experiments, magics, a test cell and stale outputs
    imports = nb["cells"].pop(0)
    assert "import math" in _src(imports)
    nb["cells"].reverse()
    nb["cells"].insert(0, _code_cell("%load_ext autoreload\nimport torch\nq = torch.randn(2, 3, 4)\n"))
    nb["cells"].append(_code_cell("out, w = scaled_dot_product_attention(q, q, q)\nout.shape\n"
                                  "assert False, 'my own check'\n",
                                  outputs=[{"output_type": "error", "ename": "AssertionError",
                                            "evalue": "", "traceback": []}]))
    nb["cells"].append(_code_cell(f"{TEST_CELL_MARKER}\nraise SystemExit\n"))
    _write_nb(nb, tmp_path / "good" / "lab1_attention.ipynb")
    result = shared_grade(tmp_path / "good", rubric=rubric, labs=[LAB1], zygote=zygote)
    assert result.score == result.max_score == rubric.labs[LAB1].max_points, result.to_dict()

    bug = (FIXTURES / "submissions" / "bug_causal_off_by_one" / "lab1_attention.py").read_text()
    _write_nb(_notebook_from_py(bug), tmp_path / "bug" / "lab1_attention.ipynb")
    (tmp_path / "bugpy").mkdir()
    (tmp_path / "bugpy" / "lab1_attention.py").write_text(bug)
    as_nb = shared_grade(tmp_path / "bug", rubric=rubric, labs=[LAB1], zygote=zygote)
    as_py = shared_grade(tmp_path / "bugpy", rubric=rubric, labs=[LAB1], zygote=zygote)
    assert 0 < as_nb.score < as_nb.max_score
    assert [t.passed for t in as_nb.labs[0].tests] == [t.passed for t in as_py.labs[0].tests]


def test_cli_grade_accepts_a_notebook_and_names_a_broken_one(tmp_path):
    sub = tmp_path / "sub"
    _write_nb(_notebook_from_py(((paths.KIT / "solutions") / "lab3_positional.py").read_text(), split=False),
              sub / "lab3_positional.ipynb")
    (sub / "lab1_attention.ipynb").write_text('{"cells": [', encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "grader.cli", "grade", str(sub), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "250"})
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    labs = data["extra_data"]["labs"]
    assert labs["lab3_positional"]["score"] == labs["lab3_positional"]["max_score"] > 0
    assert labs[LAB1]["score"] == 0 and labs[LAB1]["status"] == "error"
    assert "lab1_attention.ipynb is not a valid notebook" in data["output"]


def test_kernel_side_grader_handles_history_and_lab_dependencies(course, rubric):
    """What a test cell hands to `python -m grader.notebooks --kernel-grade`: the kernel's
    history (here: lab2's notebook code run top to bottom, test cells included, one cell run
    twice) and the lab modules the kernel imported (lab1_attention.py)."""
    from grader.notebooks import _run_grader

    lab2 = "lab2_multihead"
    nb = _nb(course / "source" / lab2 / f"{lab2}.ipynb")
    history = [_src(c) for c in nb["cells"] if c["cell_type"] == "code"]
    history.insert(2, history[1])
    request = {"lab": lab2,
               "cells": [{"label": f"In[{i}]", "source": s} for i, s in enumerate(history, 1)],
               "deps": {"lab1_attention.py": ((paths.KIT / "solutions") / "lab1_attention.py").read_text()}}
    reply = _run_grader(request)
    spec = rubric.labs[lab2]
    assert set(reply["public"]) == {n for n, t in spec.tests.items() if t.visibility == "public"}
    assert set(reply["hidden"]) == {hidden_test_id(lab2, n) for n, t in spec.tests.items()
                                    if t.visibility == "hidden"}
    failed = {k: v["message"] for kind in ("public", "hidden") for k, v in reply[kind].items()
              if not v["passed"]}
    assert not failed, failed


def test_check_outside_a_kernel_says_so(capsys):
    from grader.notebooks import GraderUnavailable, check

    with pytest.raises(GraderUnavailable, match="call it from a notebook"):
        check(LAB1, "test_matches_pytorch_3d")
    assert capsys.readouterr().err == ""


def test_check_hidden_prints_each_test_and_returns_the_points_passed(monkeypatch, capsys):
    """The hidden tests' one cell: a line per test (value-free message), and as the cell's
    result the points of those that passed, which nbgrader takes as partial credit."""
    import grader.notebooks as kernel

    reply = {"ok": True, "public": {}, "notes": [], "hidden": {
        "aaa": {"points": 2, "passed": True, "message": ""},
        "bbb": {"points": 1.5, "passed": False, "message": "weights: wrong values\nline two"},
        "ccc": {"points": 1, "passed": True, "message": ""}}}
    monkeypatch.setattr(kernel, "_reply", lambda lab: reply)
    assert kernel.check_hidden(LAB1, ["aaa", "bbb", "ccc"]) == 3
    out = capsys.readouterr()
    assert out.err == ""
    assert out.out.splitlines() == [
        "passed: hidden test 1 of 3 (2 points)",
        "FAILED: hidden test 2 of 3 (0 of 1.5 points)",
        "    weights: wrong values", "    line two",
        "passed: hidden test 3 of 3 (1 point)",
        f"hidden tests: 3 points ({kernel.ADVISORY})"]
    with pytest.raises(kernel.GraderUnavailable, match="no hidden test 'zzz'"):
        kernel.check_hidden(LAB1, ["aaa", "zzz"])


def test_sandboxed_grades_score_the_hidden_cell_by_partial_credit():
    """What SandboxedGrades writes into the hidden tests' cell, read by nbgrader's own
    determine_grade: the points of the hidden tests that passed."""
    pytest.importorskip("nbgrader")
    from nbformat.notebooknode import from_dict
    from nbgrader.utils import determine_grade

    from grader.authoring.nbgrader_autograde import _hidden_outputs

    cell = from_dict({"cell_type": "code", "source": "", "outputs": [], "metadata": {
        "nbgrader": {"grade": True, "solution": False, "points": 4.5,
                     "grade_id": HIDDEN_TESTS_GRADE_ID}}})
    for outcomes, points in (
            ([(True, "", "hidden test", 2.0), (False, "m", "hidden test", 0.0),
              (True, "", "hidden test", 1.0)], 3.0),
            ([(False, "m", "hidden test", 0.0)] * 2, 0.0),
            ([(True, "", "hidden test", 2.0), (True, "", "hidden test", 2.5)], 4.5),
            ([None], 0.0)):                     # a hidden test the grader did not run
        cell.outputs = _hidden_outputs(outcomes, "why")
        assert determine_grade(cell) == (points, 4.5)


def test_the_autograde_pipeline_starts_no_kernel(course):
    """The course's nbgrader_config.py: autograde grades with SandboxedGrades and has no
    step that runs the notebook in a kernel (nbgrader's Execute is an nbclient client)."""
    pytest.importorskip("nbgrader")
    from nbclient import NotebookClient
    from traitlets.config.loader import PyFileConfigLoader
    from traitlets.utils.importstring import import_item

    from grader.authoring.nbgrader_autograde import SandboxedGrades

    config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    steps = [import_item(name) for name in config.Autograde.autograde_preprocessors]
    assert SandboxedGrades in steps
    assert [s.__name__ for s in steps if issubclass(s, NotebookClient)] == []


@pytest.mark.parametrize("order", ["kernel_first", "kernel_after"])
def test_sandboxed_grades_refuses_a_pipeline_that_runs_a_kernel(order):
    """An old or hand-edited config that puts nbgrader's Execute back fails before any
    kernel starts (Execute is only constructed here), wherever Execute stands."""
    pytest.importorskip("nbgrader")
    import nbformat
    from nbconvert.exporters import NotebookExporter
    from nbgrader.preprocessors import Execute
    from traitlets.config import Config

    from grader.authoring.nbgrader_autograde import KernelInPipeline, SandboxedGrades

    exporter = NotebookExporter()
    steps = [Execute, SandboxedGrades] if order == "kernel_first" else [SandboxedGrades, Execute]
    with pytest.raises(KernelInPipeline, match="runs the student's notebook in a kernel"):
        for step in steps:
            exporter.register_preprocessor(step, enabled=True)
        exporter.from_notebook_node(nbformat.v4.new_notebook(),
                                    resources={"nbgrader": {"notebook": LAB1}})
    # `nbgrader autograde --no-execute` disables Execute: accepted
    quiet = NotebookExporter(config=Config({"Execute": {"enabled": False}}))
    quiet.register_preprocessor(Execute)
    quiet.register_preprocessor(SandboxedGrades)


# ======================================================================================
# Real nbgrader, end to end
# ======================================================================================


def _nbgrader(env: dict, course: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc




def _fill(release: dict, py: str) -> dict:
    """The released notebook with each solution cell replaced by the same-named definition of
    *py*, as a student fills it in."""
    tree = ast.parse(py)
    defs = {n.name: ast.get_source_segment(py, n) for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    nb = copy.deepcopy(release)
    for c in nb["cells"]:
        gid = _meta(c).get("grade_id", "")
        if _meta(c).get("solution") and gid.startswith("solution_"):
            c["source"] = defs[gid[len("solution_"):]]
    return nb


KERNEL_ATTACKS = {
    "eve_sys_modules": textwrap.dedent("""\
        import sys as _s, types as _t
        _m = _t.ModuleType("grader.notebooks")
        _m.check = lambda *a, **k: print("PASSED")
        _s.modules["grader.notebooks"] = _m
        """),
    "fin_patched_check": textwrap.dedent("""\
        import grader.notebooks as _g
        _g.check = lambda *a, **k: None
        """),
    "gil_ipython_hooks": textwrap.dedent("""\
        get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)
        """),
    "hal_builtins": textwrap.dedent("""\
        import builtins as _b
        _real_import = _b.__import__
        def _import(name, *a, **k):
            module = _real_import(name, *a, **k)
            if name.startswith("grader"):
                module.check = lambda *a, **k: None
            return module
        _b.__import__ = _import
        """),
}


@pytest.fixture(scope="module")
def graded_course(tmp_path_factory, rubric):
    """A course whose lab1 was released and autograded for three students:
    alice: the solution, in a messy notebook (reordered, import cell and a test cell deleted,
           a solution cell retyped without metadata, experiments, magics, warnings);
    bob:   the released notebook, untouched;
    carol: the released notebook filled in with one bug (causal_mask off by one)."""
    if NBGRADER_MISSING:
        pytest.skip(NBGRADER_MISSING)
    root = tmp_path_factory.mktemp("nbgrader")
    course = root / "course"
    write_course(course, Course(paths.KIT))
    env = private_jupyter_env(root)
    proc = generate_assignments(course, list(rubric.labs), env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    source = _nb(course / "source" / LAB1 / f"{LAB1}.ipynb")
    release = _nb(course / "release" / LAB1 / f"{LAB1}.ipynb")

    alice = copy.deepcopy(source)
    cells = alice["cells"]
    cells[:] = [c for c in cells if _meta(c).get("grade_id") not in
                ("given_imports", "public_test_causal_mask_square")]
    sdpa = next(i for i, c in enumerate(cells) if _meta(c).get("grade_id") == "solution_scaled_dot_product_attention")
    mask = next(i for i, c in enumerate(cells) if _meta(c).get("grade_id") == "solution_causal_mask")
    retyped = cells.pop(mask)
    retyped["metadata"] = {}                                   # deleted and typed anew
    retyped["source"] = _src(retyped).replace("### BEGIN SOLUTION", "").replace("### END SOLUTION", "")
    cells.insert(sdpa, retyped)                                # and moved above
    sdpa_cell = cells[sdpa + 1]
    sdpa_cell["source"] = _src(sdpa_cell).replace(
        "    d_k = q.size(-1)\n",
        "    d_k = q.size(-1)\n"
        "    warnings.warn('a warning from student code', UserWarning)\n"
        "    _copy = torch.tensor(q)  # PyTorch warns: copy construct from a tensor\n")
    cells.insert(sdpa + 2, _code_cell(textwrap.dedent("""\
        %precision 3
        import math, os, sys, threading, warnings
        import torch
        !echo shell commands are fine
        q = torch.randn(2, 4, 8)
        out, w = scaled_dot_product_attention(q, q, q)
        print(out.shape)
        print("a line on stderr", file=sys.stderr)
        assert out.sum() == 12345, "a failed check of my own"
        """), outputs=[{"output_type": "stream", "name": "stderr", "text": "stale\n"}]))
    students = {
        "alice": alice,
        "bob": release,
        "carol": _fill(release, (FIXTURES / "submissions" / "bug_causal_off_by_one" / f"{LAB1}.py").read_text()),
    }
    # The kernel's own checks, beaten from a solution cell (the stubs still raise
    # NotImplementedError): each must still score the stub's 0 points.
    for student, attack in KERNEL_ATTACKS.items():
        nb = copy.deepcopy(release)
        cell = next(c for c in nb["cells"] if _meta(c).get("solution"))
        cell["source"] = attack + _src(cell)
        students[student] = nb
    for student, nb in students.items():
        _write_nb(nb, course / "submitted" / student / LAB1 / f"{LAB1}.ipynb")
    auto = _nbgrader(env, course, "autograde", LAB1, "--create")
    _nbgrader(env, course, "generate_feedback", LAB1)
    # dan hands in the lab 2 notebook alone (no lab1_attention.py anywhere), solved.
    _write_nb(_nb(course / "source" / LAB2 / f"{LAB2}.ipynb"),
              course / "submitted" / "dan" / LAB2 / f"{LAB2}.ipynb")
    auto2 = _nbgrader(env, course, "autograde", LAB2, "--create")
    # ...and the newest labs' notebooks, solved, each alone: lab 7 (plain functions) and
    # lab 8 (graded on what its train() achieves).
    later = {}
    for lab in LATER_LABS:
        _write_nb(_nb(course / "source" / lab / f"{lab}.ipynb"),
                  course / "submitted" / "dan" / lab / f"{lab}.ipynb")
        run = _nbgrader(env, course, "autograde", lab, "--create")
        later[lab] = run.stdout + run.stderr
    return {"course": course, "env": env, "autograde_log": auto.stdout + auto.stderr,
            "autograde_lab2_log": auto2.stdout + auto2.stderr, "autograde_later_logs": later}


LATER_LABS = ("lab7_relative_positions", "lab8_train_transformer")


@needs_nbgrader
@pytest.mark.parametrize("lab", LATER_LABS)
def test_the_newest_labs_notebooks_autograde_to_full_marks(graded_course, rubric, lab):
    """Stock nbgrader, with the course's config, on a solved lab 7 and lab 8 notebook."""
    db = f"sqlite:///{graded_course['course'] / 'gradebook.db'}"
    with Gradebook(db) as gb:
        dan = gb.find_submission(lab, "dan")
        assert dan.score == dan.max_score == rubric.labs[lab].max_points, \
            graded_course["autograde_later_logs"][lab][-4000:]


@needs_nbgrader
def test_released_notebooks_have_no_solutions_and_no_hidden_tests(graded_course, rubric):
    course = graded_course["course"]
    for lab, spec in rubric.labs.items():
        text = (course / "release" / lab / f"{lab}.ipynb").read_text(encoding="utf-8")
        nb = json.loads(text)
        source = _nb(course / "source" / lab / f"{lab}.ipynb")
        for name, t in spec.tests.items():
            if t.visibility == "hidden":
                assert name not in text
                assert f"hidden={hidden_test_id(lab, name)!r}" not in text
        assert "BEGIN HIDDEN TESTS" not in text and "BEGIN SOLUTION" not in text
        assert "hidden=" not in text and "check_hidden" not in text
        # the hidden tests' one cell is there, collapsed, without its tests; and the scratch cell
        cell = next(c for c in nb["cells"] if _meta(c).get("grade_id") == HIDDEN_TESTS_GRADE_ID)
        assert cell["metadata"].get("jupyter") == {"source_hidden": True}
        assert "hidden tests" in _src(cell)
        assert any(_src(c).startswith(SCRATCH_CELL_MARKER) for c in nb["cells"])
        assert not NOT_IN_A_NOTEBOOK.search(text.replace("\\n", "\n"))
        assert "check(" in text                       # public tests are there
        tests = [c for c in nb["cells"] if _meta(c).get("grade")]
        assert sum(_meta(c)["points"] for c in tests) == pytest.approx(spec.max_points)
        # solution code is gone, the TODO hints stay
        solutions = [c for c in source["cells"] if _meta(c).get("solution")]
        released = {_meta(c)["grade_id"]: _src(c) for c in nb["cells"] if _meta(c).get("solution")}
        for c in solutions:
            body = _src(c).split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0]
            code = [ln.strip() for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("#")]
            # a telling statement (over 25 characters), else the longest (a one-line body)
            stmt = next((ln for ln in code if len(ln) > 25), max(code, key=len))
            assert stmt not in released[_meta(c)["grade_id"]]
            assert "raise NotImplementedError()" in released[_meta(c)["grade_id"]]
            assert "# TODO(Lab " in released[_meta(c)["grade_id"]]


@needs_nbgrader
def test_autograde_full_untouched_and_one_bug(graded_course, rubric):
    db = f"sqlite:///{graded_course['course'] / 'gradebook.db'}"
    full = rubric.labs[LAB1].max_points
    with Gradebook(db) as gb:
        scores = {s: gb.find_submission(LAB1, s).score for s in ("alice", "bob", "carol")}
        assert scores["alice"] == full, graded_course["autograde_log"][-4000:]
        assert scores["bob"] == 0
        assert 0 < scores["carol"] < full
        # Code in the student's kernel cannot change a grade: the sandboxed grader's count.
        attacked = {s: gb.find_submission(LAB1, s).score for s in KERNEL_ATTACKS}
        assert attacked == dict.fromkeys(KERNEL_ATTACKS, 0.0), attacked
        assert gb.find_submission(LAB1, "alice").max_score == full
    # the one-bug score is what `grader grade` gives the same code as a .py file
    from grader.grading import grade_submission
    result = grade_submission(FIXTURES / "submissions" / "bug_causal_off_by_one" / f"{LAB1}.py",
                              course=Course(paths.KIT, rubric), labs=[LAB1])
    assert scores["carol"] == result.score
    # all hidden tests in one cell, worth the points of those that pass (partial credit)
    hidden = [t for t in result.lab(LAB1).tests if t.visibility == "hidden"]
    with Gradebook(db) as gb:
        grade = gb.find_grade(HIDDEN_TESTS_GRADE_ID, LAB1, LAB1, "carol")
        assert grade.auto_score == pytest.approx(sum(t.score for t in hidden))
        assert 0 < grade.auto_score < grade.max_score == sum(t.max_score for t in hidden)
        assert gb.find_grade(HIDDEN_TESTS_GRADE_ID, LAB1, LAB1, "alice").auto_score == \
            grade.max_score


@needs_nbgrader
def test_the_lab2_notebook_alone_autogrades_to_full_marks(graded_course, rubric):
    """Stock nbgrader, the lab 2 notebook alone: its import of lab 1 runs in the kernel
    without a lab1_attention.py, and the grader gives lab 2 the course's lab 1."""
    db = f"sqlite:///{graded_course['course'] / 'gradebook.db'}"
    with Gradebook(db) as gb:
        dan = gb.find_submission(LAB2, "dan")
        assert dan.score == dan.max_score == rubric.labs[LAB2].max_points, \
            graded_course["autograde_lab2_log"][-4000:]


@needs_nbgrader
def test_warnings_in_student_code_cost_nothing_and_no_cell_runs(graded_course):
    """alice's code warns (a PyTorch UserWarning, warnings.warn) where it is graded, in the
    sandbox, and her scratch cell prints to stderr: nothing of it reaches a test cell (full
    marks: test_autograde_full_untouched_and_one_bug), because autograde runs no cell of the
    notebook; the test cells hold the sandbox's verdicts only."""
    nb = _nb(graded_course["course"] / "autograded" / "alice" / LAB1 / f"{LAB1}.ipynb")
    scratch = next(c for c in nb["cells"] if "a line on stderr" in _src(c))
    assert scratch["outputs"] == [] and scratch.get("execution_count") is None
    for c in nb["cells"]:
        if _meta(c).get("grade"):
            kinds = [(o["output_type"], o.get("name")) for o in c["outputs"]]
            assert kinds == [("stream", "stdout")] or \
                kinds == [("stream", "stdout"), ("execute_result", None)], (c["id"], c["outputs"])
        elif c["cell_type"] == "code":
            assert c["outputs"] == [], (c["id"], c["outputs"])
    restored = [c for c in nb["cells"] if _meta(c).get("grade_id") == "public_test_causal_mask_square"]
    assert len(restored) == 1 and "passed" in "".join("".join(o.get("text", "")) for o in restored[0]["outputs"])


@needs_nbgrader
def test_feedback_shows_no_hidden_tests_nor_expected_values(graded_course, rubric):
    course = graded_course["course"]
    html = (course / "feedback" / "carol" / LAB1 / f"{LAB1}.html").read_text(encoding="utf-8")
    assert "FAILED" in html and "hidden test" in html
    assert "HIDDEN TESTS" not in html and "hidden=" not in html
    for name, t in rubric.labs[LAB1].tests.items():
        if t.visibility == "hidden":
            assert name not in html
    nb = _nb(course / "autograded" / "carol" / LAB1 / f"{LAB1}.ipynb")
    for c in nb["cells"]:
        if _meta(c).get("grade_id", "").startswith("hidden_"):
            for o in c["outputs"]:
                text = "\n".join(o.get("traceback", [])) + "".join(o.get("text", ""))
                assert "expected" not in text.lower(), text


@needs_nbgrader
def test_export_results_into_the_gradebook(graded_course, rubric, tmp_path, zygote, monkeypatch):
    from grader.authoring.nbgrader_bridge import export_results, load_result_files
    from grader.outputs.gradescope import write_gradescope

    course = graded_course["course"]
    # grade the submitted notebooks with the sandboxed grader, as `grader grade --out` does
    out = tmp_path / "results"
    for student in ("alice", "carol"):
        result = shared_grade(course / "submitted" / student, rubric=rubric, zygote=zygote,
                                  name=student)
        write_gradescope(result, out / student / "results.json")
    results = load_result_files([out])
    assert [s for s, _ in results] == ["alice", "carol"]

    # a fresh gradebook: assignments, notebooks, grade cells and submissions are created
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    monkeypatch.setenv("PATH", os.pathsep.join(
        p for p in os.environ.get("PATH", "").split(os.pathsep) if p != os.path.dirname(sys.executable)))
    report = export_results(fresh, results)          # finds nbgrader's alembic by itself
    assert report.ok and report.exported == 2           # lab1 each; missing labs are skipped
    with Gradebook(fresh) as gb:
        for student, result in results:
            lab = result.lab(LAB1)
            sub = gb.find_submission(LAB1, student)
            assert sub.score == lab.score and sub.max_score == lab.max_score
            for t in lab.tests:
                if t.visibility == "public":
                    grade = gb.find_grade(grade_id_for(LAB1, t.name, "public"), LAB1, LAB1, student)
                    assert grade.auto_score == t.score and grade.max_score == t.max_score
            hidden = [t for t in lab.tests if t.visibility == "hidden"]
            grade = gb.find_grade(HIDDEN_TESTS_GRADE_ID, LAB1, LAB1, student)
            assert grade.auto_score == pytest.approx(sum(t.score for t in hidden))
            assert grade.max_score == pytest.approx(sum(t.max_score for t in hidden))
        with pytest.raises(missing_entry()):
            gb.find_submission("lab2_multihead", "alice")

    # the course's own gradebook (made by generate_assignment and autograde): the same cells
    db = f"sqlite:///{course / 'gradebook.db'}"
    with Gradebook(db) as gb:
        before = {s: gb.find_submission(LAB1, s).score for s in ("alice", "carol")}
    proc = subprocess.run([sys.executable, "-m", "grader.cli", "nbgrader-export", "--db", db,
                           "--score", "manual", str(out)], capture_output=True, text=True,
                          timeout=300, env=graded_course["env"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with Gradebook(db) as gb:
        for student, result in results:
            sub = gb.find_submission(LAB1, student)
            assert sub.score == result.lab(LAB1).score == before[student]
            cells = {c.name for c in gb.find_notebook(LAB1, LAB1).grade_cells}
            assert cells == {grade_cell_for(LAB1, n, t.visibility)
                             for n, t in rubric.labs[LAB1].tests.items()}
            assert HIDDEN_TESTS_GRADE_ID in cells
            grade = gb.find_grade(grade_id_for(LAB1, "test_causal_mask_square", "public"),
                                  LAB1, LAB1, student)
            assert grade.manual_score == (1.0 if student == "alice" else 0.0)
            comment = gb.find_comment("solution_causal_mask", LAB1, LAB1, student)
            assert comment.auto_comment.startswith("attention-labs grader:")


SCRATCH_ONE_LINE = ("q = torch.randn(2, 3, 4); out, w = scaled_dot_product_attention(q, q, q); "
                    "print(w[0])\n")
SCRATCH_THREE_LINES = ("q = torch.randn(2, 3, 4)\nout, w = scaled_dot_product_attention(q, q, q)\n"
                       "print(w[0])\n")


@pytest.mark.parametrize("scratch", [SCRATCH_ONE_LINE, SCRATCH_THREE_LINES],
                         ids=["one_line", "three_lines"])
def test_a_scratch_cell_is_left_out_the_same_on_one_line_or_three(scratch, rubric, zygote,
                                                                    tmp_path):
    """One rule for what is kept, statement by statement, however the statements are laid
    out: the call of the student's own function never runs at import, on one line or
    three, and the correct lab keeps its full marks."""
    from grader.intake.notebook import Cell, extract_lab_source

    own = "import torch\n\ndef scaled_dot_product_attention(q, k, v):\n    return q, k\n"
    got = extract_lab_source([Cell(label="cell 1", source=own, test=False),
                              Cell(label="cell 2", source=scratch, test=False)], name="nb")
    kept = ast.parse(got.source)
    calls = [n.func.id for n in ast.walk(kept) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name)]
    assert "scaled_dot_product_attention" not in calls and "print" not in calls, got.source
    assert any("cell 2 line 1 (runs your code)" in n or "cell 2 line 2 (runs your code)" in n
               for n in got.notes), got.notes

    nb = _notebook_from_py(((paths.KIT / "solutions") / f"{LAB1}.py").read_text())
    nb["cells"].append(_code_cell(scratch))
    sub = tmp_path / "sub"
    _write_nb(nb, sub / f"{LAB1}.ipynb")
    result = shared_grade(sub, rubric=rubric, labs=[LAB1], zygote=zygote)
    lab = result.lab(LAB1)
    assert lab.status == "graded" and lab.score == lab.max_score, \
        [(t.name, t.message) for t in lab.tests if not t.passed]


def _hostile(source: str) -> dict:
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [_code_cell(source)]}


@pytest.mark.parametrize("source, reason", [
    ("x = a" + ".b" * 2000 + "\n", "code cell 1, line 1: a chain of more than 100 dotted names"),
    ("x = " + "(" * 500 + "1" + ")" * 500 + "\n", "code cell 1: brackets nested more than 100"),
    ("x = [\n" + "[\n" * 300 + "]\n" * 301, "code cell 1: brackets nested more than 100"),
    ("%time x = 1\n" * 250_000, "its code cells hold more than 2 MiB of text"),
    ("x = '" + "a" * 20_000 + "'\n", "code cell 1, line 1: a line of 20006 characters"),
], ids=["attribute_chain", "parens", "nested_lists", "magic_lines", "long_line"])
def test_a_hostile_notebook_is_refused_before_its_code_is_parsed(source, reason, tmp_path,
                                                                  monkeypatch):
    """Caps on cells, text, lines and nesting come before any parse or compile: a clear
    refusal, never a RecursionError, a 24 MB results.json or minutes of parsing."""
    from grader.intake.notebook import lab_source_from_notebook

    path = _write_nb(_hostile(source), tmp_path / f"{LAB1}.ipynb")

    def never(*a, **k):
        raise AssertionError("parsed before the caps")

    monkeypatch.setattr("grader.intake.notebook._clean_cell", never)   # where parsing starts
    with pytest.raises(NotebookError) as exc:
        lab_source_from_notebook(path, rel=path.name, lab_file=f"{LAB1}.py", forbidden=())
    assert reason in str(exc.value), str(exc.value)


def test_too_many_code_cells_are_refused(tmp_path):
    from grader.intake.notebook import lab_source_from_notebook

    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
          "cells": [_code_cell(f"x{i} = {i}\n") for i in range(1001)]}
    path = _write_nb(nb, tmp_path / f"{LAB1}.ipynb")
    with pytest.raises(NotebookError, match="more than 1000 code cells"):
        lab_source_from_notebook(path, rel=path.name, lab_file=f"{LAB1}.py", forbidden=())


# --------------------------------------------------------------------------------------
# No student code runs on the grading machine (issue #28)
# --------------------------------------------------------------------------------------

# A cell a student adds to the solved notebook: it reads what the grading machine holds
# (the course secret, a solution, a hidden suite) through the grader's own paths, prints
# it (nbgrader keeps a cell's outputs in the autograded notebook, and generate_feedback
# shows them to the student), and leaves a file in the grader's course folder and in the
# nbgrader course. Safe to run: it refuses any folder outside the test's temporary root,
# and the grader's course there is a copy (with the kit's hidden suite copied into it,
# since the kit's own suites live in the package, outside any temporary folder).
LOOK_AROUND = '''\
def _look_around(root):
    import pathlib
    import grader.paths
    course = pathlib.Path(grader.paths.KIT)
    nbgrader_course = pathlib.Path.cwd().parents[2]
    for folder in (course, nbgrader_course):
        if not str(folder.resolve()).startswith(root):
            raise SystemExit(f"not the test's temporary folder: {{folder}}")
    print("secret:", (course / ".grader-secret").read_text())
    print("solution:", (course / "solutions" / "lab1_attention.py").read_text())
    print("hidden suite:", (course / "suites" / "hidden" / "test_lab1_attention.py").read_text())
    for folder in (course, nbgrader_course):
        (folder / "written-by-a-student").write_text("a student's kernel ran here")

_look_around({root!r})
'''


@pytest.fixture(scope="module")
def attacked_course(tmp_path_factory, rubric):
    """Lab 1 released and autograded by real nbgrader with the course's config, for one
    student whose solved notebook carries LOOK_AROUND, against a copy of the grader's
    course (GRADER_COURSE_DIR) holding a fresh secret and canaries in a solution and a
    hidden suite."""
    import secrets
    import shutil

    if NBGRADER_MISSING:
        pytest.skip(NBGRADER_MISSING)
    root = tmp_path_factory.mktemp("nbgrader-attacked").resolve()
    grading = root / "grading-course"
    shutil.copytree((paths.KIT / "solutions"), grading / "solutions")
    shutil.copy((paths.KIT / "rubric.yaml"), grading / "rubric.yaml")
    canaries = {"secret": secrets.token_hex(32), "solution": "canary-" + secrets.token_hex(8),
                "suite": "canary-" + secrets.token_hex(8)}
    (grading / ".grader-secret").write_text(canaries["secret"] + "\n")
    (grading / ".grader-secret").chmod(0o600)
    solution = grading / "solutions" / f"{LAB1}.py"
    solution.write_text(solution.read_text() + f"# {canaries['solution']}\n")
    suite = grading / "suites" / "hidden" / f"test_{LAB1}.py"
    suite.parent.mkdir(parents=True)
    suite.write_text((paths.SUITES / "hidden" / f"test_{LAB1}.py").read_text()
                     + f"# {canaries['suite']}\n")
    course = root / "course"
    # The notebooks are the kit's (what students get holds no canary); the config names
    # the grading machine's course, whose solution and hidden suite carry the canaries.
    write_course(course, Course(paths.KIT), labs=[LAB1])
    config = course / "nbgrader_config.py"
    kit = json.dumps(str(Course(paths.KIT).folder))
    assert kit in config.read_text()
    config.write_text(config.read_text().replace(kit, json.dumps(str(grading))))
    env = {**private_jupyter_env(root), "GRADER_COURSE_DIR": str(grading)}
    proc = generate_assignments(course, [LAB1], env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    nb = _nb(course / "source" / LAB1 / f"{LAB1}.ipynb")
    first_test = next(i for i, c in enumerate(nb["cells"]) if _meta(c).get("grade"))
    nb["cells"].insert(first_test, _code_cell(LOOK_AROUND.format(root=str(root))))
    _write_nb(nb, course / "submitted" / "mallory" / LAB1 / f"{LAB1}.ipynb")
    auto = _nbgrader(env, course, "autograde", LAB1)
    _nbgrader(env, course, "generate_feedback", LAB1)
    return {"root": root, "course": course, "grading": grading, "canaries": canaries,
            "env": env, "log": auto.stdout + auto.stderr}


@needs_nbgrader
def test_a_notebook_cell_reaches_nothing_on_the_grading_machine(attacked_course, rubric):
    """nbgrader autograde with the course's config starts no kernel: the student's cell
    reads nothing, writes nothing, and the feedback holds none of the course; the grades
    and test cells' outputs are the sandboxed grader's, so the solution keeps full marks."""
    root, course = attacked_course["root"], attacked_course["course"]
    assert not list(root.rglob("written-by-a-student")), "a student's cell ran on the grader"
    feedback = (course / "feedback" / "mallory" / LAB1 / f"{LAB1}.html").read_text(encoding="utf-8")
    autograded_path = course / "autograded" / "mallory" / LAB1 / f"{LAB1}.ipynb"
    autograded = autograded_path.read_text(encoding="utf-8")
    for what, canary in attacked_course["canaries"].items():
        assert canary not in feedback, f"the feedback shows the course's {what}"
        assert canary not in autograded, f"the autograded notebook holds the course's {what}"
    assert "_look_around" in feedback                      # the student's own cell, unrun
    nb = json.loads(autograded)
    for c in nb["cells"]:
        if c["cell_type"] != "code":
            continue
        if _meta(c).get("grade"):          # a test cell: the sandbox's verdict, on stdout only
            assert [(o["output_type"], o.get("name")) for o in c["outputs"]][:1] == \
                [("stream", "stdout")], (c["id"], c["outputs"])
            assert "graded in the sandbox" in "".join(c["outputs"][0]["text"])
        else:                              # the student's cells were never run
            assert c["outputs"] == [] and c.get("execution_count") is None, (c["id"], c["outputs"])
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        mallory = gb.find_submission(LAB1, "mallory")
        assert mallory.score == mallory.max_score == rubric.labs[LAB1].max_points, \
            attacked_course["log"][-4000:]


@needs_nbgrader
def test_nbgrader_export_writes_spreadsheet_safe_cells(attacked_course, rubric):
    """`nbgrader export` with the course's config: student ids from folder names (here
    added to the gradebook as nbgrader adds them) are neutralised and quoted, scores stay
    bare numbers, and mallory's full marks are there."""
    import csv
    import io

    from grader.outputs.spreadsheet import text_cell

    course = attacked_course["course"]
    hostile = ['=HYPERLINK("http://x.example","click")', "+SUM(1,1)", "-1+1", "@SUM(1,1)",
               "a,b"]
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for student in hostile:
            gb.update_or_create_student(student)
    _nbgrader(attacked_course["env"], course, "export", "--to", "exported.csv")
    text = (course / "exported.csv").read_bytes().decode("utf-8")
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    by = {r["student_id"]: r for r in rows}
    assert set(by) == {"mallory", *(text_cell(s) for s in hostile)}
    assert float(by["mallory"]["score"]) == rubric.labs[LAB1].max_points
    for line in text.split("\r\n")[1:-1]:
        assert re.search(r',\d+(\.\d+)?,\d+(\.\d+)?,\d+(\.\d+)?,\d+(\.\d+)?$', line), line
        assert line.startswith('"lab1_attention",'), line
