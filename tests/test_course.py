"""The committed course content agrees with itself: stubs, solutions, rubric and suites."""

from __future__ import annotations

from pathlib import Path

from grader import paths
from grader.rubric import check_rubric_against_suites, load_rubric
from grader.authoring.stubs import leaked_solution_lines, solution_regions, stub_drift


def test_committed_stubs_are_what_the_generator_writes():
    assert stub_drift(solutions_dir=(paths.KIT / "solutions"), exercises_dir=(paths.KIT / "exercises")) == []


def test_stubs_hold_no_solution_code():
    assert leaked_solution_lines(solutions_dir=(paths.KIT / "solutions"), exercises_dir=(paths.KIT / "exercises")) == []


def test_every_lab_has_a_solution_a_stub_and_suites():
    rubric = load_rubric((paths.KIT / "rubric.yaml"))
    for lab in rubric.labs.values():
        solution = (paths.KIT / "solutions") / lab.file
        assert solution.is_file() and ((paths.KIT / "exercises") / lab.file).is_file()
        assert solution_regions(solution.read_text(), path=str(solution)), lab.file
        for visibility in ("public", "hidden"):
            assert (paths.SUITES / visibility / f"test_{lab.name}.py").is_file()


def test_rubric_and_suites_agree():
    assert check_rubric_against_suites(load_rubric((paths.KIT / "rubric.yaml")), paths.SUITES) == []


def test_points_come_only_from_the_rubric():
    """No suite hard-codes points: scores are computed from rubric.yaml alone."""
    for suite in paths.SUITES.glob("*/test_*.py"):
        text = suite.read_text()
        assert "points" not in text and "max_score" not in text, suite


def test_example_class_is_what_the_builder_writes(tmp_path):
    """examples/submissions/*.zip are rebuilt byte for byte from solutions + fixtures."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_examples",
                                                  paths.KIT / "examples" / "build_examples.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    fresh = builder.build(tmp_path)
    committed = sorted((paths.KIT / "examples" / "submissions").glob("*.zip"))
    assert sorted(p.name for p in fresh) == [p.name for p in committed]
    for path in fresh:
        assert path.read_bytes() == (paths.KIT / "examples" / "submissions" / path.name).read_bytes(), (
            f"{path.name} is stale: run python examples/build_examples.py")


# -- the course is one object, passed explicitly (#24 item 2) ------------------------------

def _course_copy(folder, *, secret: str, title: str):
    """A course folder like the kit's, its lab 1 retitled, its solutions marked, its secret
    ``secret`` (hex)."""
    import shutil

    folder.mkdir(parents=True)
    for name in ("solutions", "exercises"):
        shutil.copytree(paths.KIT / name, folder / name)
    text = (paths.KIT / "rubric.yaml").read_text()
    (folder / "rubric.yaml").write_text(text.replace("title: Scaled dot-product attention",
                                                     f"title: {title}", 1))
    with open(folder / "solutions" / "lab1_attention.py", "a") as fh:
        fh.write(f"\n# {title}\n")
    (folder / ".grader-secret").write_text(secret + "\n")
    return folder


def test_a_course_and_its_grader_ignore_another_course_in_the_environment(tmp_path, monkeypatch):
    from grader.course import Course
    from grader.engine import reference
    from grader.grading import Grader

    a = _course_copy(tmp_path / "a", secret="aa" * 32, title="Course A attention")
    b = _course_copy(tmp_path / "b", secret="bb" * 32, title="Course B attention")
    monkeypatch.setenv("GRADER_COURSE_DIR", str(b))
    course = Course(a)
    assert course.folder == a.resolve()
    assert course.rubric.labs["lab1_attention"].title == "Course A attention"
    assert (course.solutions, course.exercises) == (a.resolve() / "solutions", a.resolve() / "exercises")
    assert course.suites == paths.SUITES
    assert course.secret == bytes.fromhex("aa" * 32)
    grader = Grader(course)         # builds no sandbox until it grades
    try:
        assert grader.rubric is course.rubric and grader.course is course
        assert grader.secret == bytes.fromhex("aa" * 32)
        copied = Path(grader._reference_dir)
        assert "Course A attention" in (copied / "lab1_attention.py").read_text()
    finally:
        grader.close()
    before = reference._solutions
    reference.use_solutions(course.solutions)
    try:
        assert reference.load_reference("lab1_attention").__file__ == \
            str(a.resolve() / "solutions" / "lab1_attention.py")
    finally:
        reference.use_solutions(before)


def test_a_course_checks_its_rubric_against_the_suites_once(tmp_path, monkeypatch):
    import grader.course as course_module
    from grader.course import Course

    calls = []
    real = course_module.check_rubric_against_suites
    monkeypatch.setattr(course_module, "check_rubric_against_suites",
                        lambda *a: calls.append(a) or real(*a))
    course = Course(_course_copy(tmp_path / "a", secret="aa" * 32, title="A"))
    for _ in range(3):
        assert course.rubric.labs
    assert len(calls) == 1


def test_a_bad_rubric_is_refused_when_the_course_is_made(tmp_path):
    import pytest

    from grader.course import Course
    from grader.errors import RubricError

    a = _course_copy(tmp_path / "a", secret="aa" * 32, title="A")
    text = (a / "rubric.yaml").read_text()
    (a / "rubric.yaml").write_text(text.replace("test_matches_pytorch_3d:",
                                                "test_matches_pytorch_3:", 1))
    with pytest.raises(RubricError, match="test_matches_pytorch_3"):
        assert Course(a).rubric


def test_only_the_cli_reads_the_course_from_the_environment():
    """No module of the grader but ``grader.cli`` names GRADER_COURSE_DIR or ``paths.ENV``;
    ``grader.paths`` reads no environment and computes no course path on access."""
    import ast

    offenders = []
    for path in sorted(paths.PACKAGE.rglob("*.py")):
        rel = path.relative_to(paths.PACKAGE)
        if rel.parts[0] == "cli":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value == "GRADER_COURSE_DIR":
                offenders.append(f"{rel}:{node.lineno}: names GRADER_COURSE_DIR")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "paths" and node.attr not in ("PACKAGE", "SUITES", "KIT"):
                offenders.append(f"{rel}:{node.lineno}: paths.{node.attr}")
    paths_tree = ast.parse((paths.PACKAGE / "paths.py").read_text(encoding="utf-8"))
    for node in ast.walk(paths_tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
            offenders.append(f"paths.py:{node.lineno}: reads the environment")
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            offenders.append(f"paths.py:{node.lineno}: computes attributes on access")
    assert offenders == []


def test_nbgrader_config_names_the_course_it_was_built_from(tmp_path, monkeypatch):
    """nbgrader autograde grades with the course ``grader notebooks`` was run for, named in
    nbgrader_config.py: not whatever GRADER_COURSE_DIR says when nbgrader runs."""
    import json

    from grader.authoring.course_notebooks import CONFIG_FILE, course_files
    from grader.course import Course

    a = _course_copy(tmp_path / "a", secret="aa" * 32, title="A")
    monkeypatch.setenv("GRADER_COURSE_DIR", str(tmp_path / "elsewhere"))
    config = course_files(Course(a), labs=["lab1_attention"])[CONFIG_FILE]
    assert f"c.SandboxedGrades.course = {json.dumps(str(a.resolve()))}\n" in config


def test_graders_starting_together_on_a_new_course_read_one_whole_secret(tmp_path):
    """Processes that need a new course's secret at the same moment (a batch's grading
    processes, parallel test workers on a fresh clone) all get the same one, and none reads
    it half-written: the file is complete from the moment it exists."""
    import os
    import time

    from grader.secret import course_secret

    for attempt in range(12):
        course = tmp_path / f"course{attempt}"
        course.mkdir()
        start = time.monotonic() + 0.2
        children = []
        for _ in range(8):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:                                    # a child: read it, report, leave
                os.close(read)
                try:
                    while time.monotonic() < start:
                        pass
                    answer = course_secret(course).hex()
                except Exception as exc:  # noqa: BLE001 - reported to the parent as text
                    answer = f"{type(exc).__name__}: {exc}"
                os.write(write, answer.encode())
                os._exit(0)
            os.close(write)
            children.append((pid, read))
        answers = set()
        for pid, read in children:
            with os.fdopen(read, "rb") as fh:
                answers.add(fh.read().decode())
            os.waitpid(pid, 0)
        assert len(answers) == 1 and len(next(iter(answers))) == 64, answers
