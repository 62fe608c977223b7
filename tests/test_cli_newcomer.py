"""A CLI a newcomer does not trip over (#16): which folder ``grader check`` checks and its
per-lab summary, near-miss lab file names, ``--version``, a ``--help`` that loads no torch,
``--course`` / ``GRADER_COURSE_DIR`` with the course elsewhere, and ``grader init``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from helpers import make_submission, run_cli
from grader import paths
from grader.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from grader.intake import sanitize
from grader.intake.names import is_close, normalise

GRADER = [sys.executable, "-m", "grader.cli"]
LAB1, LAB3 = "lab1_attention", "lab3_positional"


def run(*args, cwd=None, env=None):
    """The command's logic, in this process (helpers.run_cli); the tests of the installed
    entry point start ``GRADER`` themselves."""
    return run_cli(*args, cwd=cwd, env=env)


# -- 1. grader check: which folder, one file, one summary line per lab ----------------------

def test_check_without_a_folder_checks_the_current_one_when_it_holds_lab_files(tmp_path):
    (tmp_path / f"{LAB3}.py").write_bytes(((paths.KIT / "solutions") / f"{LAB3}.py").read_bytes())
    proc = run("check", "--lab", LAB3, cwd=tmp_path)
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    assert f"Checking {tmp_path.resolve()}" in proc.stdout
    n = sum(t.visibility == "public" for t in _rubric().labs[LAB3].tests.values())
    assert proc.stdout.rstrip().splitlines()[-1] == f"lab3: {n}/{n} public tests pass"


def test_check_without_a_folder_falls_back_to_exercises_and_says_so(tmp_path):
    (tmp_path / "notes.txt").write_text("not a lab\n")
    proc = run("check", "--lab", LAB3, cwd=tmp_path)
    assert proc.returncode == EXIT_FAILED, proc.stdout + proc.stderr    # untouched stubs
    assert f"Checking {paths.KIT / 'exercises'}" in proc.stdout
    n = sum(t.visibility == "public" for t in _rubric().labs[LAB3].tests.values())
    assert proc.stdout.rstrip().splitlines()[-1] == f"lab3: 0/{n} public tests pass"


def test_check_of_one_lab_file_checks_that_lab_only(tmp_path):
    target = tmp_path / f"{LAB3}.py"
    target.write_bytes(((paths.KIT / "solutions") / f"{LAB3}.py").read_bytes())
    proc = run("check", str(target))
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    summaries = [line for line in proc.stdout.splitlines() if "public tests pass" in line]
    n = sum(t.visibility == "public" for t in _rubric().labs[LAB3].tests.values())
    assert summaries == [f"lab3: {n}/{n} public tests pass"]


def test_check_says_which_figures_are_points_and_which_are_tests():
    """The table and Total count points (the rubric's weights), the last line per lab counts
    tests; README shows these lines as ``grader check`` prints them."""
    import re

    proc = run("check", paths.KIT / "solutions" / f"{LAB1}.py")
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    lab = _rubric().labs[LAB1]
    points = sum(t.points for t in lab.tests.values() if t.visibility == "public")
    n = sum(t.visibility == "public" for t in lab.tests.values())
    assert f"{LAB1} - {lab.title}: {points:g}/{points:g} points" in proc.stdout
    assert re.search(rf"^Total: {points:g}/{points:g} points  \(\d+\.\d\d s\)$", proc.stdout,
                     re.M), proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1] == f"lab1: {n}/{n} public tests pass"
    readme = (paths.KIT / "README.md").read_text(encoding="utf-8")
    shown = re.search(r"grader check lab1_attention.py\n(.*?)```", readme.split("## Who does what")[1],
                      re.S)
    assert shown, "README shows the end of a grader check of lab 1"
    printed = {re.sub(r"\(\d+\.\d\d s\)", "(T s)", line).rstrip()
               for line in proc.stdout.splitlines()}
    for line in shown.group(1).strip().splitlines():
        if not line.startswith(("$", "...")):
            assert re.sub(r"\(\d+\.\d\d s\)", "(T s)", line).rstrip() in printed, line


def test_check_of_a_folder_with_one_lab_notebook_shows_that_lab_only(tmp_path):
    """A notebook student's folder holds one lab's notebook: the check is of that lab,
    not a table of the seven others' missing files (#29)."""
    import json
    source = ((paths.KIT / "solutions") / f"{LAB3}.py").read_text()
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                "cells": [{"cell_type": "code", "metadata": {}, "execution_count": None,
                           "outputs": [], "source": source.splitlines(keepends=True)}]}
    (tmp_path / f"{LAB3}.ipynb").write_text(json.dumps(notebook))
    proc = run("check", cwd=tmp_path)
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    n = sum(t.visibility == "public" for t in _rubric().labs[LAB3].tests.values())
    summaries = [line for line in proc.stdout.splitlines() if line.startswith("lab")
                 and ": " in line and "/" in line]
    assert summaries[-1] == f"lab3: {n}/{n} public tests pass", proc.stdout
    assert "lab1" not in proc.stdout and "not found" not in proc.stdout, proc.stdout


def _rubric():
    from grader.rubric import load_rubric
    return load_rubric((paths.KIT / "rubric.yaml"))


# -- 2. near-miss lab file names ------------------------------------------------------------

@pytest.mark.parametrize("name, expected", [
    ("lab1_attention (1).py", "lab1_attention.py"),
    ("Lab2_Multihead.py", "lab2_multihead.py"),
    ("lab3.py", "lab3_positional.py"),
    ("lab1-attention.py", "lab1_attention.py"),
    ("lab1 attention copy.py", "lab1_attention.py"),
    ("LAB4_Transformer_Block(2).py", "lab4_transformer_block.py"),
])
def test_a_near_miss_file_name_is_close_to_its_lab(name, expected):
    assert is_close(name, expected)
    others = [f for f in ("lab1_attention.py", "lab2_multihead.py", "lab3_positional.py",
                          "lab4_transformer_block.py") if f != expected]
    assert not any(is_close(name, other) for other in others), name


@pytest.mark.parametrize("name", ["notes.py", "lab2_attention.py", "README.md",
                                  "lab1_attention.txt", "helpers.py"])
def test_other_file_names_are_not_close_to_lab1(name):
    assert not is_close(name, "lab1_attention.py")


def test_normalise_drops_case_copies_and_separators():
    assert normalise("Lab1-Attention (1)") == normalise("lab1_attention") == "lab1_attention"
    assert normalise("lab_1 attention copy") == "lab1_attention"


@pytest.mark.parametrize("misnamed", ["lab1_attention (1).py", "Lab1_Attention.py",
                                      "lab1.py", "lab1-attention.py"])
def test_intake_says_did_you_mean_and_lists_the_files(tmp_path, rubric, misnamed):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / misnamed).write_text("x = 1\n")
    (sub / "README.md").write_text("hi\n")
    clean = sanitize(sub, rubric, list(rubric.labs))
    problem = clean.problems[LAB1]
    assert problem.kind == "missing"
    assert problem.message.startswith("lab1_attention.py was not found in the submission")
    assert "did you mean lab1_attention.py?" in problem.message
    assert f"Files found: {', '.join(sorted([misnamed, 'README.md']))}" in problem.message
    # the other labs have no near miss: no suggestion, the plain message
    assert clean.problems["lab2_multihead"].message == \
        "lab2_multihead.py was not found in the submission"


def test_a_misnamed_notebook_is_suggested_as_the_lab_notebook(tmp_path, rubric):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "lab1_attention (2).ipynb").write_text("{}")
    message = sanitize(sub, rubric, [LAB1]).problems[LAB1].message
    assert "did you mean lab1_attention.ipynb?" in message


def test_one_misnamed_file_given_alone_gets_the_suggestion(tmp_path, rubric):
    f = tmp_path / "lab3 (1).py"
    f.write_text("x = 1\n")
    assert "did you mean lab3_positional.py?" in sanitize(f, rubric, [LAB3]).problems[LAB3].message


def test_every_route_reports_the_suggestion_grade_writes_it_to_results_json(tmp_path):
    sub = make_submission("ok_einsum", tmp_path / "sub")
    (sub / f"{LAB3}.py").rename(sub / f"{LAB3} (1).py")
    proc = run("grade", str(sub), "--out", str(tmp_path / "out"), "--lab", LAB3)
    assert proc.returncode == EXIT_OK, proc.stderr
    output = (tmp_path / "out" / "results.json").read_text()
    assert "did you mean lab3_positional.py?" in output
    assert "lab3_positional (1).py" in output


# -- 3. --version and a --help without torch ------------------------------------------------

def test_version_comes_from_the_package_metadata():
    from importlib.metadata import version
    proc = run("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"grader {version('attention-labs')}"


@pytest.mark.parametrize("argv", [["--help"], ["check", "--help"], ["batch", "--help"],
                                  ["grade", "--help"], ["init", "--help"],
                                  ["nbgrader-export", "--help"]])
def test_help_imports_no_torch(argv):
    code = ("import sys\n"
            "from grader.cli import main\n"
            "try:\n"
            f"    main({argv!r})\n"
            "except SystemExit as e:\n"
            "    assert e.code == 0, e.code\n"
            "heavy = sorted(m for m in ('torch', 'numpy', 'pytest', 'matplotlib', 'grader.grading')"
            " if m in sys.modules)\n"
            "print('HEAVY', heavy)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: grader" in proc.stdout
    assert "HEAVY []" in proc.stdout, proc.stdout[-300:]


# -- 5. the course found through --course or GRADER_COURSE_DIR -----------------------------

@pytest.fixture
def course_copy(tmp_path):
    """The kit's course folder copied elsewhere (what an installed grader is pointed at)."""
    course = tmp_path / "course"
    course.mkdir()
    shutil.copyfile((paths.KIT / "rubric.yaml"), course / "rubric.yaml")
    for folder in ("solutions", "exercises"):
        shutil.copytree(paths.KIT / folder, course / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return course


def _no_course_env():
    return {k: v for k, v in os.environ.items() if k != "GRADER_COURSE_DIR"}


def test_course_option_points_every_command_at_the_course(course_copy, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # A course whose exercises are the solutions: check of exercises/ passes only there.
    for f in (course_copy / "solutions").glob("lab*.py"):
        shutil.copyfile(f, course_copy / "exercises" / f.name)
    proc = subprocess.run([*GRADER, "--course", str(course_copy), "check", "--lab", LAB3],
                          capture_output=True, text=True, cwd=elsewhere, env=_no_course_env(),
                          timeout=600)
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    assert f"Checking {course_copy / 'exercises'}" in proc.stdout
    # the same through the environment variable
    proc = subprocess.run([*GRADER, "stubs", "--check"], capture_output=True, text=True,
                          cwd=elsewhere, env={**_no_course_env(), "GRADER_COURSE_DIR": str(course_copy)},
                          timeout=600)
    assert proc.returncode == EXIT_FAILED       # exercises are not the stubs there
    assert str(course_copy / "exercises") in proc.stdout


@pytest.mark.slow
def test_an_installed_grader_finds_the_course_only_through_course_or_env(course_copy, tmp_path):
    """As after ``pip install .``: the package alone in site-packages, no course beside it."""
    site = tmp_path / "site-packages"
    shutil.copytree(paths.PACKAGE, site / "grader", ignore=shutil.ignore_patterns("__pycache__"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**_no_course_env(), "PYTHONPATH": str(site), "COLUMNS": "200"}

    def grader(*argv, **extra):
        return subprocess.run([*GRADER, *argv], capture_output=True, text=True, cwd=elsewhere,
                              env={**env, **extra}, timeout=600)

    where = subprocess.run(
        [sys.executable, "-c", "import grader; print(grader.__file__)"], capture_output=True,
        text=True, cwd=elsewhere, env=env)
    assert where.stdout.strip() == str(site / "grader" / "__init__.py")
    proc = grader("check")
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr == (f"error: no rubric.yaml in {site} (pass --course DIR or set "
                           "GRADER_COURSE_DIR)\n")
    proc = grader("--course", str(course_copy), "check", str(course_copy / "solutions"),
                  "--lab", LAB3)
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    root = tmp_path / "class"
    make_submission("ok_einsum", root / "ada")
    proc = grader("batch", str(root), "--out", str(tmp_path / "out"), "--lab", LAB3,
                  "--jobs", "1", **{"GRADER_COURSE_DIR": str(course_copy)})
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    assert (course_copy / ".grader-secret").is_file()     # the course's, not the kit's


def test_a_missing_rubric_says_so_by_name(tmp_path):
    empty = tmp_path / "x" / "y"
    empty.mkdir(parents=True)
    for argv in (["--course", str(empty), "check"], ["--course", str(empty), "grade", str(empty),
                                                     "--out", str(tmp_path / "o")],
                 ["--course", str(empty), "batch", str(empty), "--out", str(tmp_path / "o")]):
        proc = subprocess.run([*GRADER, *argv], capture_output=True, text=True, cwd=tmp_path,
                              env=_no_course_env(), timeout=300)
        assert proc.returncode == EXIT_BAD_INPUT, (argv, proc.stderr)
        assert proc.stderr == (f"error: no rubric.yaml in {empty} (pass --course DIR or set "
                               "GRADER_COURSE_DIR)\n"), proc.stderr


# Every command that reads a course, with what it needs besides (``{tmp}``: a scratch folder).
COURSE_COMMANDS = (
    ["stubs", "--check"], ["stubs"], ["validate"], ["notebooks", "--check"], ["notebooks"],
    ["check"], ["grade", "{tmp}", "--out", "{tmp}/o"], ["feedback", "{tmp}", "--out", "{tmp}/o"],
    ["batch", "{tmp}", "--out", "{tmp}/o"], ["release", "--out", "{tmp}/rel"],
    ["gradescope", "--out", "{tmp}/ag.zip"], ["classroom", "{tmp}"], ["init", "{tmp}/new"],
)


def _command_id(argv):
    return argv[0] + ("-check" if "--check" in argv else "")


NO_COURSE = {
    "option": lambda missing: (["--course", str(missing)], {}),
    "env": lambda missing: ([], {"GRADER_COURSE_DIR": str(missing)}),
}


@pytest.mark.parametrize("how", sorted(NO_COURSE))
@pytest.mark.parametrize("argv", COURSE_COMMANDS, ids=_command_id)
def test_a_course_folder_that_does_not_exist_is_one_error(tmp_path, argv, how):
    """Nothing to compare, build or grade: one ``error:`` line naming the folder and where
    it was named, exit 2; never "stubs are in sync" (exit 0) or a report that goes on."""
    missing = tmp_path / "nonexistent"
    before, env = NO_COURSE[how](missing)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    proc = run(*before, *argv, cwd=tmp_path, env=env)
    assert proc.returncode == EXIT_BAD_INPUT, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    source = "--course" if how == "option" else "GRADER_COURSE_DIR"
    assert proc.stderr == (f"error: {source} {missing}: no such course folder (pass --course "
                           "DIR or set GRADER_COURSE_DIR)\n"), proc.stderr
    assert not (tmp_path / "new").exists() and not (tmp_path / "rel").exists()


@pytest.mark.parametrize("argv", COURSE_COMMANDS, ids=_command_id)
def test_a_course_folder_without_a_rubric_is_one_error(tmp_path, argv):
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    proc = run("--course", empty, *argv, cwd=tmp_path)
    assert proc.returncode == EXIT_BAD_INPUT, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert proc.stderr == (f"error: no rubric.yaml in {empty} (pass --course DIR or set "
                           "GRADER_COURSE_DIR)\n"), proc.stderr


@pytest.mark.parametrize("argv", (["stubs", "--check"], ["stubs"], ["notebooks", "--check"]))
def test_instructor_commands_in_a_student_kit_say_so(tmp_path, argv):
    """A student kit (rubric and exercises, no solutions): no "extra stub" per exercise,
    no "wrote" nothing with exit 0: one error saying the command needs solutions/."""
    kit = tmp_path / "kit"
    kit.mkdir()
    shutil.copyfile(paths.KIT / "rubric.yaml", kit / "rubric.yaml")
    shutil.copytree(paths.KIT / "exercises", kit / "exercises",
                    ignore=shutil.ignore_patterns("__pycache__"))
    proc = run("--course", kit, *argv, cwd=tmp_path)
    assert proc.returncode == EXIT_BAD_INPUT, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert proc.stderr.startswith(f"error: grader {argv[0]} is for instructors: "), proc.stderr
    assert f"{kit} does not have" in proc.stderr and proc.stderr.count("\n") == 1


def test_init_in_an_installed_grader_without_a_kit_says_what_to_pass(tmp_path, monkeypatch):
    """No --course, no GRADER_COURSE_DIR and a kit with no course files (a plain ``pip
    install``): one error naming the kit and --from."""
    monkeypatch.setattr(paths, "KIT", tmp_path / "site-packages")
    (tmp_path / "site-packages").mkdir()
    proc = run("init", tmp_path / "new", cwd=tmp_path, env={"GRADER_COURSE_DIR": ""})
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr == (f"error: no course to copy: {tmp_path / 'site-packages'} does not "
                           "have rubric.yaml and solutions/; pass --from a course folder (e.g. "
                           "a checkout of attention-labs)\n"), proc.stderr


def test_init_from_a_named_course_that_is_not_there_copies_nothing(tmp_path):
    """``--from`` names the course to copy; ``--course`` is then not read."""
    proc = run("--course", tmp_path / "nonexistent", "init", tmp_path / "new",
               "--from", paths.KIT, cwd=tmp_path)
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    proc = run("init", tmp_path / "new2", "--from", tmp_path / "nonexistent", cwd=tmp_path)
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ")
    assert not (tmp_path / "new2").exists()


def test_the_course_is_resolved_once_by_the_cli_and_written_nowhere(tmp_path, monkeypatch):
    """--course, else GRADER_COURSE_DIR, else the kit; the environment is read, not set."""
    from grader.cli.common import COURSE_ENV, resolve_course_dir
    from grader.course import Course

    other = tmp_path / "other"
    monkeypatch.delenv(COURSE_ENV, raising=False)
    assert resolve_course_dir(None) == paths.KIT
    monkeypatch.setenv(COURSE_ENV, str(other))
    assert resolve_course_dir(None) == other
    assert resolve_course_dir(str(tmp_path)) == tmp_path
    assert os.environ[COURSE_ENV] == str(other)      # untouched: nothing downstream reads it
    course = Course(resolve_course_dir(str(tmp_path)))
    expected = (tmp_path, tmp_path / "rubric.yaml", tmp_path / "solutions", tmp_path / "exercises")
    assert expected == (course.folder, course.rubric_path, course.solutions, course.exercises)
    assert paths.PACKAGE / "suites" == paths.SUITES  # the suites come with the package


# -- 6. grader init -------------------------------------------------------------------------

def test_init_makes_a_course_that_validates(tmp_path):
    dest = tmp_path / "my-course"
    proc = run("init", str(dest), cwd=tmp_path)
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    assert (dest / "rubric.yaml").read_bytes() == (paths.KIT / "rubric.yaml").read_bytes()
    assert sorted(p.name for p in (dest / "solutions").glob("lab*.py")) == \
        sorted(p.name for p in (paths.KIT / "solutions").glob("lab*.py"))
    assert (dest / "exercises" / "lab1_attention.py").is_file()
    readme = (dest / "README.md").read_text()
    assert f"--course {dest}" in readme and "grader" in readme
    assert ".grader-secret" in (dest / ".gitignore").read_text()
    proc = subprocess.run([*GRADER, "--course", str(dest), "validate"], capture_output=True,
                          text=True, cwd=tmp_path, env=_no_course_env(), timeout=600)
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout
    assert (dest / ".grader-secret").is_file()          # the new course's own secret


def test_init_refuses_a_folder_that_is_not_empty(tmp_path):
    dest = tmp_path / "taken"
    dest.mkdir()
    (dest / "thesis.tex").write_text("keep me\n")
    proc = run("init", str(dest))
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr.startswith(f"error: {dest}: already exists and is not empty")
    assert "Traceback" not in proc.stderr
    assert [p.name for p in dest.iterdir()] == ["thesis.tex"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".taken.")]   # no leftovers


def test_check_prints_the_time_the_student_waited(tmp_path):
    """The time on the Total line is the wall time since the command started (interpreter,
    torch, sandbox and all), not only the grading's share of it (#29)."""
    import re
    import time
    (tmp_path / f"{LAB3}.py").write_bytes(((paths.KIT / "solutions") / f"{LAB3}.py").read_bytes())
    t0 = time.monotonic()
    # A process of its own: the printed time counts from that process's start.
    proc = subprocess.run([*GRADER, "check", str(tmp_path), "--lab", LAB3],
                          capture_output=True, text=True, cwd=tmp_path)
    wall = time.monotonic() - t0
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    printed = float(re.search(r"Total: \S+ points\s+\(([\d.]+) s\)", proc.stdout).group(1))
    # Only the interpreter's start before it and the exit after it are not counted.
    assert 0.75 * wall <= printed <= wall, (printed, wall)
