"""The committed course content agrees with itself: stubs, solutions, rubric and suites."""

from __future__ import annotations

from grader import paths
from grader.rubric import check_rubric_against_suites, load_rubric
from grader.authoring.stubs import leaked_solution_lines, solution_regions, stub_drift


def test_committed_stubs_are_what_the_generator_writes():
    assert stub_drift(solutions_dir=paths.SOLUTIONS, exercises_dir=paths.EXERCISES) == []


def test_stubs_hold_no_solution_code():
    assert leaked_solution_lines(solutions_dir=paths.SOLUTIONS, exercises_dir=paths.EXERCISES) == []


def test_every_lab_has_a_solution_a_stub_and_suites():
    rubric = load_rubric(paths.RUBRIC)
    for lab in rubric.labs.values():
        solution = paths.SOLUTIONS / lab.file
        assert solution.is_file() and (paths.EXERCISES / lab.file).is_file()
        assert solution_regions(solution.read_text(), path=str(solution)), lab.file
        for visibility in ("public", "hidden"):
            assert (paths.SUITES / visibility / f"test_{lab.name}.py").is_file()


def test_rubric_and_suites_agree():
    assert check_rubric_against_suites(load_rubric(paths.RUBRIC), paths.SUITES) == []


def test_points_come_only_from_the_rubric():
    """No suite hard-codes points: scores are computed from rubric.yaml alone."""
    for suite in paths.SUITES.glob("*/test_*.py"):
        text = suite.read_text()
        assert "points" not in text and "max_score" not in text, suite


def test_example_class_is_what_the_builder_writes(tmp_path):
    """examples/submissions/*.zip are rebuilt byte for byte from solutions + fixtures."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_examples",
                                                  paths.COURSE / "examples" / "build_examples.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    fresh = builder.build(tmp_path)
    committed = sorted((paths.COURSE / "examples" / "submissions").glob("*.zip"))
    assert sorted(p.name for p in fresh) == [p.name for p in committed]
    for path in fresh:
        assert path.read_bytes() == (paths.COURSE / "examples" / "submissions" / path.name).read_bytes(), (
            f"{path.name} is stale: run python examples/build_examples.py")
