"""What the grader writes (#16): files the course's group can read unless the rubric says
``output_mode: private``, summary figures to 2 decimals, and an nbgrader export that reads
past files that are not results."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys

import pytest

from grader import paths
from grader.errors import RubricError
from grader.outputs import atomic
from grader.outputs.gradebook import build_gradebook, score_distribution
from grader.outputs.gradescope import write_gradescope
from grader.results import LabResult, SubmissionResult
from grader.results import TestResult as Outcome
from grader.rubric import load_rubric

GRADER = [sys.executable, "-m", "grader.cli"]
LAB1 = "lab1_attention"


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    """Set the process umask for one test (restored after it)."""
    saved = []

    def set_(value: int) -> None:
        saved.append(os.umask(value))

    yield set_
    if saved:
        os.umask(saved[0])


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)],
                         ids=["umask022", "umask027", "umask077"])
def test_written_files_follow_the_umask_not_mkstemp(tmp_path, umask, mask, expected):
    umask(mask)
    atomic.atomic_write_text(tmp_path / "results.json", "{}\n")
    atomic.atomic_write_bytes(tmp_path / "plot.png", b"\x89PNG")
    assert mode_of(tmp_path / "results.json") == mode_of(tmp_path / "plot.png") == expected


def test_private_output_mode_makes_files_0600(tmp_path, umask):
    umask(0o022)
    atomic.use_output_mode("private")
    try:
        atomic.atomic_write_text(tmp_path / "grades.csv", "student\n")
    finally:
        atomic.use_output_mode("group")
    assert mode_of(tmp_path / "grades.csv") == 0o600
    atomic.atomic_write_text(tmp_path / "after.csv", "student\n")
    assert mode_of(tmp_path / "after.csv") == 0o644
    with pytest.raises(ValueError):
        atomic.use_output_mode("public")


def _rubric_with(tmp_path, line: str):
    text = (paths.KIT / "rubric.yaml").read_text()
    path = tmp_path / "rubric.yaml"
    path.write_text(re.sub(r"^labs:\n", f"{line}\nlabs:\n", text, count=1, flags=re.M))
    return path


def test_rubric_output_mode_is_read_and_checked(tmp_path):
    assert load_rubric((paths.KIT / "rubric.yaml")).output_mode == "group"
    assert load_rubric(_rubric_with(tmp_path, "output_mode: private")).output_mode == "private"
    bad = _rubric_with(tmp_path, "output_mode: world")
    with pytest.raises(RubricError) as info:
        load_rubric(bad)
    line = bad.read_text().splitlines().index("output_mode: world") + 1
    assert info.value.errors == [f"{bad}:{line}: output_mode: expected one of group, private, "
                                 "got the string 'world'"]


def test_grade_with_a_private_rubric_writes_0600(tmp_path):
    rubric = _rubric_with(tmp_path, "output_mode: private")
    proc = subprocess.run([*GRADER, "--rubric", str(rubric), "grade", str((paths.KIT / "solutions")),
                           "--out", str(tmp_path / "out"), "--lab", "lab3_positional"],
                          capture_output=True, text=True, timeout=600, umask=0o022)
    assert proc.returncode == 0, proc.stderr
    assert mode_of(tmp_path / "out" / "results.json") == 0o600


# -- summary figures rounded ----------------------------------------------------------------

def _result(student: str, passed: list[bool], points: float) -> SubmissionResult:
    lab = LabResult(name=LAB1, title="", file=f"{LAB1}.py", status="graded")
    for i, ok in enumerate(passed):
        lab.tests.append(Outcome(lab=LAB1, name=f"test_{i}", description="",
                                    visibility="public", max_score=points, passed=ok))
    result = SubmissionResult(submission=student)
    result.labs.append(lab)
    return result


def test_summary_figures_have_two_decimals():
    score = score_distribution([1.0, 1.0, 2.0], 3.0)
    assert (score["mean"], score["median"]) == (1.33, 1.0)
    assert score_distribution([0.1 + 0.2], 1.0)["max"] == 0.3       # not 0.30000000000000004
    edges = score_distribution([], 10 / 3)["histogram"]["bin_edges"]
    assert all(e == round(e, 2) for e in edges) and edges[-1] == 3.33   # not 3.3333...


def test_gradebook_summary_json_is_rounded(tmp_path, rubric):
    one_lab = rubric.only([LAB1])
    tests = list(one_lab.labs[LAB1].tests)
    for student, n in (("ada", 1), ("bob", 1), ("cy", 2)):
        result = SubmissionResult(submission=student)
        lab = LabResult(name=LAB1, title="", file=f"{LAB1}.py", status="graded")
        for i, name in enumerate(tests):
            t = one_lab.labs[LAB1].tests[name]
            lab.tests.append(Outcome(lab=LAB1, name=name, description="",
                                        visibility=t.visibility, max_score=t.points,
                                        passed=i < n))
        result.labs.append(lab)
        write_gradescope(result, tmp_path / student / "results.json")
    build_gradebook(out=tmp_path, students=["ada", "bob", "cy"], rubric=one_lab, plots=False)
    summary = json.loads((tmp_path / "summary.json").read_text())
    for figure in (summary["score"]["mean"], summary["labs"][LAB1]["mean"]):
        assert figure == round(figure, 2)
    points = [one_lab.labs[LAB1].tests[n].points for n in tests]
    expected = round((points[0] + points[0] + points[0] + points[1]) / 3, 2)
    assert summary["score"]["mean"] == expected


def test_batch_prints_figures_with_two_decimals():
    from grader.cli.batch import points
    assert [points(x) for x in (4.333333, 12.0, 0.5, 2 / 3, 0)] == ["4.33", "12", "0.5",
                                                                    "0.67", "0"]


# -- nbgrader export reads past what is not a result ----------------------------------------

def test_load_result_files_skips_files_that_are_not_results(tmp_path):
    from grader.authoring.nbgrader_bridge import load_result_files

    out = tmp_path / "results"
    write_gradescope(_result("ada", [True, False, False], 1 / 3), out / "ada" / "results.json")
    (out / "README.md").write_text("# results of week 1\n")
    (out / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1\x00\x00\x10\x00")
    (out / "._results.json").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X")
    (out / "package.json").write_text(json.dumps({"name": "x", "labs": ["lab1"]}))
    (out / "notes.json").write_text(json.dumps({"tests": [1, 2]}))
    (out / "summary.json").write_text(json.dumps({"labs": {}, "tests": {}}))
    skipped: list[str] = []
    found = load_result_files([out, out / "README.md", out / ".DS_Store"], skipped=skipped)
    assert [student for student, _ in found] == ["ada"]
    assert found[0][1].labs[0].score == pytest.approx(1 / 3, abs=1e-4)
    assert sorted(os.path.basename(s) for s in skipped) == [".DS_Store", "README.md",
                                                            "notes.json", "package.json"]


def test_nbgrader_export_command_skips_stray_files_and_rounds(tmp_path):
    pytest.importorskip("nbgrader")
    out = tmp_path / "results"
    write_gradescope(_result("ada", [True, True, False], 1 / 3), out / "ada" / "results.json")
    (out / "README.md").write_text("# results\n")
    (out / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (out / "package.json").write_text(json.dumps({"labs": ["lab1"]}))
    db = f"sqlite:///{tmp_path / 'gradebook.db'}"
    proc = subprocess.run([*GRADER, "nbgrader-export", "--db", db, str(out),
                           str(out / "README.md"), str(out / ".DS_Store")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "skipped 3 file(s) that hold no grader result" in proc.stdout
    assert f"ada: {LAB1}: 0.67/1 (auto scores)" in proc.stdout
