"""The command line as a user meets it: exit statuses, files written, errors that name the cause."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import run_cli
from grader import paths
from grader.cli import main
from grader.errors import EXIT_BAD_INPUT, EXIT_GRADER_FAULT, GraderError, GraderFault

GRADER = [sys.executable, "-m", "grader.cli"]


def run(*args, cwd=None):
    """The command's logic, in this process (helpers.run_cli)."""
    return run_cli(*args, cwd=cwd)


def run_process(*args, cwd=None):
    """The installed entry point in a process of its own: its exit status as a process."""
    return subprocess.run([*GRADER, *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "COLUMNS": "200"}, timeout=600)


def test_check_passes_on_solutions_for_one_lab():
    proc = run("check", str((paths.KIT / "solutions")), "--lab", "lab3_positional")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lab3_positional" in proc.stdout and "FAIL" not in proc.stdout


def test_check_fails_on_untouched_stub_and_says_not_implemented():
    proc = run_process("check", "--lab", "lab1_attention")
    assert proc.returncode == 1
    assert "not implemented yet" in proc.stdout
    assert "hidden" not in proc.stdout.split("public test(s) failing")[0].lower()


def test_grade_writes_results_json(tmp_path):
    proc = run("grade", str((paths.KIT / "solutions")), "--out", str(tmp_path), "--lab", "lab3_positional")
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["score"] == data["extra_data"]["labs"]["lab3_positional"]["max_score"] > 0


def test_bad_rubric_is_reported_with_file_and_line(tmp_path):
    bad = tmp_path / "rubric.yaml"
    bad.write_text("version: 1\nlabs:\n  lab1_attention:\n    title: x\n    file: lab1_attention.py\n"
                   "    tests:\n      test_a: {points: two, visibility: public}\n")
    proc = run("--rubric", str(bad), "check", str((paths.KIT / "solutions")))
    assert proc.returncode == 2
    assert f"{bad}:7:" in proc.stderr and "points" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_submission_is_a_clear_error(tmp_path):
    proc = run_process("grade", str(tmp_path / "nope"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "no such file or folder" in proc.stderr and "Traceback" not in proc.stderr


def test_validate_passes_on_the_course():
    proc = run("validate")
    assert proc.returncode == 0, proc.stdout
    assert "FAIL" not in proc.stdout


def test_grade_accepts_a_zip_and_writes_html_feedback(tmp_path):
    zipped = paths.KIT / "examples" / "submissions" / "cy_missing_lab3.zip"
    proc = run("grade", str(zipped), "--out", str(tmp_path), "--lab", "lab3_positional", "--html")
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["score"] == 0
    assert "not handed in: lab3_positional" in data["output"]
    [missing] = data["tests"]               # a lab not handed in is one entry, not its tests
    assert "lab3_positional.py was not found in the submission" in missing["output"]
    assert (tmp_path / "feedback.html").read_text().lstrip().lower().startswith("<!doctype html")


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@pytest.mark.parametrize("error", sorted(_subclasses(GraderError), key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_every_grader_error_is_one_line_per_problem_and_its_exit_code(error, monkeypatch, capsys):
    """BatchError, RunnerError, SandboxError... included: no command shows a traceback."""
    def fail(args):
        raise error(["first problem at rubric.yaml:3", "second problem"])

    monkeypatch.setattr("grader.cli.batch.cmd_batch", fail)
    code = main(["batch", "somewhere", "--out", "elsewhere"])
    out = capsys.readouterr()
    assert code == error.exit_code
    assert code == (EXIT_GRADER_FAULT if issubclass(error, GraderFault) else EXIT_BAD_INPUT)
    assert out.err == "error: first problem at rubric.yaml:3\nerror: second problem\n"
    assert out.out == ""


@pytest.mark.parametrize("command", [["check", str((paths.KIT / "solutions"))],
                                     ["grade", str((paths.KIT / "solutions")), "--out", "OUT"],
                                     ["batch", "CLASS", "--out", "OUT"]],
                         ids=["check", "grade", "batch"])
def test_a_rubric_that_disagrees_with_the_suites_grades_nobody(command, tmp_path):
    """A typo in a test's name would fail that test for every student: every command
    refuses the rubric first, naming the file, the line and the nearest test name."""
    text = ((paths.KIT / "rubric.yaml")).read_text()
    typo = tmp_path / "rubric.yaml"
    typo.write_text(text.replace("test_matches_pytorch_3d:", "test_matches_pytorch_3dd:", 1))
    line = text[: text.index("test_matches_pytorch_3d:")].count("\n") + 1
    (tmp_path / "CLASS" / "ada").mkdir(parents=True)
    argv = [str(tmp_path / a) if a in ("OUT", "CLASS") else a for a in command]
    proc = run("--rubric", str(typo), *argv)
    assert proc.returncode == EXIT_BAD_INPUT, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{typo}:{line}: labs.lab1_attention.tests.test_matches_pytorch_3dd: no test " \
        "function 'test_matches_pytorch_3dd'" in proc.stderr, proc.stderr
    assert "did you mean 'test_matches_pytorch_3d'" in proc.stderr
    assert not (tmp_path / "OUT").exists() or not any((tmp_path / "OUT").rglob("results.json"))
