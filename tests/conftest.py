"""Fixtures shared by the grader's own tests; helpers live in tests/helpers.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Under pytest-xdist (the full run: one test process per core), each test process and the
# grader processes its tests start compute with one thread: OpenMP's threads wait by
# spinning, so two processes of two threads each on two cores, beside the sandbox workers,
# slowed lab 8's gradings 2-4x (11 of them: 260 s against 125 s). Read when torch is
# first imported, which no module here does at import time.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    if "torch" in sys.modules:                  # a plugin imported it before us
        sys.modules["torch"].set_num_threads(1)

sys.path.insert(0, str(Path(__file__).parent / "guard"))
import no_sandbox  # noqa: E402  (tests/guard: the fast loop's guard)

from helpers import SharedGradings, SharedTrainings, SharedZygote  # noqa: E402
from grader import paths  # noqa: E402
from grader.rubric import load_rubric  # noqa: E402


@pytest.fixture(scope="session")
def rubric():
    return load_rubric((paths.KIT / "rubric.yaml"))


@pytest.fixture(scope="session", autouse=True)
def kit_references():
    """The kit's reference solutions for the tests that load references or mistakes
    directly, outside a Grader (a Grader's pytest session sets its course's before every
    run: ``SuiteRunner``, ``grader.engine.reference.use_solutions``)."""
    from grader.engine.reference import use_solutions

    use_solutions(paths.KIT / "solutions")
    yield
    use_solutions(None)


@pytest.fixture(scope="session")
def zygote(rubric):
    """One torch-loaded zygote for the tests that only grade (import torch is paid once);
    restarted if a test left it dead (helpers.SharedZygote)."""
    from grader.course import Course

    # What a Grader of the kit's course hides from its workers (``Course.private_paths``).
    shared = SharedZygote(forbidden=rubric.all_forbidden,
                          hide=Course(paths.KIT, rubric).private_paths)
    try:
        yield shared
    finally:
        shared.close()


@pytest.fixture(scope="session")
def graded(rubric, zygote, tmp_path_factory):
    """graded(name, labs=None) -> (SubmissionResult, captured): fixture ``name`` (or
    "solutions", "exercises") graded on ``labs`` once for every test of this process that
    asks, kept only when it came out as its expect.yaml says (helpers.SharedGradings)."""
    return SharedGradings(rubric, zygote, tmp_path_factory.mktemp("graded"))


# Whole modules, and the fixtures, that make a test slow (pytest -m "not slow" leaves them):
# every test that starts a sandbox or trains, here or in a process it starts. The guard
# below fails a test that does so without being slow.
SLOW_MODULES = {"test_attacks.py", "test_batch.py", "test_environment.py"}
SLOW_FIXTURES = {"autograder_zip", "release", "graded_course",
                 "zygote", "zygotes", "graded",  # a sandbox (and every fixture built on one)
                 "batch_out", "cluster"}       # a graded batch, a Dask cluster
# Single tests that start a sandbox (in this process or in a grader process they start),
# run nbgrader or a benchmark, in modules that are otherwise fast: module -> test functions.
SLOW_TESTS = {
    "test_bad_input.py": {"test_missing_submission_through_the_cli_exits_2"},
    "test_benchmarks.py": {"test_bench_check_runs_grader_check_cold_and_prints_its_figures",
                           "test_bench_check_covers_a_one_lab_check_of_every_lab",
                           "test_a_batch_summary_has_its_cpu_by_lab_adding_up_to_its_cpu"},
    "test_bundles.py": {"test_release_refuses_to_publish_a_leak",
                        "test_release_classroom_workflow_fetches_the_grader_from_a_secret",
                        "test_a_reference_function_under_another_name_stops_the_release"},
    "test_cli.py": {"test_check_passes_on_solutions_for_one_lab",
                    "test_check_fails_on_untouched_stub_and_says_not_implemented",
                    "test_grade_writes_results_json", "test_missing_submission_is_a_clear_error",
                    "test_validate_passes_on_the_course",
                    "test_grade_accepts_a_zip_and_writes_html_feedback"},
    "test_cli_newcomer.py": {
        "test_check_without_a_folder_checks_the_current_one_when_it_holds_lab_files",
        "test_check_without_a_folder_falls_back_to_exercises_and_says_so",
        "test_check_of_one_lab_file_checks_that_lab_only",
        "test_every_route_reports_the_suggestion_grade_writes_it_to_results_json",
        "test_course_option_points_every_command_at_the_course",
        "test_init_makes_a_course_that_validates",
        "test_check_of_a_folder_with_one_lab_notebook_shows_that_lab_only",
        "test_check_prints_the_time_the_student_waited",
        "test_check_says_which_figures_are_points_and_which_are_tests"},
    "test_fault.py": {"test_a_grader_fault_on_one_lab_is_retried_with_a_fresh_grader_on_gradescope"},
    "test_feedback.py": {"test_feedback_of_dot_titles_the_folder_takes_labs_and_keeps_whole_sentences"},
    "test_cli_outputs.py": {"test_grade_with_a_private_rubric_writes_0600",
                            "test_nbgrader_export_command_skips_stray_files_and_rounds"},
    "test_grading.py": {"test_a_sandbox_that_dies_mid_submission_is_a_grader_fault_not_a_score",
                        "test_a_grader_launches_its_zygote_then_loads_the_engine_then_waits"},
    "test_notebooks.py": {"test_cli_grade_accepts_a_notebook_and_names_a_broken_one",
                          "test_kernel_side_grader_handles_history_and_lab_dependencies"},
    "test_sandbox.py": {"test_a_launched_zygote_is_waited_for_once_and_reports_its_start",
                        "test_two_zygotes_alive_on_one_machine_never_share_a_slot",
                        "test_a_zygote_launched_but_never_started_is_closed_cleanly"},
}


@pytest.hookimpl(tryfirst=True)   # before pytest-xdist reads the xdist_group marks it adds
def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.path.name
        if _shares_a_fixture_with_its_module(item):
            # Its module's tests share what the fixture built (a graded class, a zygote per
            # mode): one test process runs them all, so it is built once (--dist loadgroup).
            item.add_marker(pytest.mark.xdist_group(module))
        elif (fixture := _graded_fixture(item)) is not None:
            # Every test of any module that asks ``graded`` for this fixture runs in one
            # process, where its grading is shared (helpers.SharedGradings).
            item.add_marker(pytest.mark.xdist_group(f"graded-{fixture}"))
        if module == "test_attacks.py":
            item.add_marker(pytest.mark.attacks)
        function = getattr(item, "originalname", item.name)
        if module in SLOW_MODULES or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) \
                or function in SLOW_TESTS.get(module, ()) or item.get_closest_marker("nbgrader"):
            item.add_marker(pytest.mark.slow)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("mode") == "root" or item.get_closest_marker("root"):
            item.add_marker(pytest.mark.root)
    if getattr(config.option, "loadgroup", False):
        _name_the_groups(items)


def _name_the_groups(items) -> None:
    """What pytest-xdist 3.8 does for --dist loadgroup, done so that pytest 9.2 sees it: the
    scheduler groups by the "@group" suffix of a test's id, which xdist writes to
    ``item._nodeid``, an attribute pytest 9.2 no longer reads (its id is ``item._id``).
    Without this every test goes to any process, and a fixture meant to be built once is
    built in each (tests of test_batch, test_cluster ... ran against half-built state)."""
    from _pytest.nodeid import NodeId

    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        if groups and hasattr(item, "_id") and "@" not in item.nodeid:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(groups)}")


def _graded_fixture(item) -> str | None:
    """The fixture submission a test parametrized by one hands to ``graded``, if any."""
    if "graded" not in getattr(item, "fixturenames", ()):
        return None
    params = getattr(getattr(item, "callspec", None), "params", {})
    return next((v for k, v in params.items() if k in ("name", "fixture")
                 and isinstance(v, str)), None)


def _shares_a_fixture_with_its_module(item) -> bool:
    """Whether ``item`` uses a fixture built once for many tests but fewer than the whole
    session (module, class or package scope)."""
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info is not None else ()):
        if any(d.scope in ("module", "class", "package") for d in defs):
            return True
    return False


@pytest.fixture(scope="session", autouse=True)
def trainings_shared_across_identical_labs():
    """Lab 8's train() costs ~15 CPU seconds; most fixture submissions carry the reference's
    lab 8 file unchanged. In this test process a successful training is run once per (lab
    file bytes, request) and its reply reused (helpers.SharedTrainings); a failed or timed-out
    one is not kept, so a training that ran out of time under load fails only its own test.
    Grading code is unchanged: each Session still trains once per submission."""
    from grader.engine.student import Session

    original = Session._train_once
    Session._train_once = SharedTrainings(original).method()
    try:
        yield
    finally:
        Session._train_once = original


GUARD = Path(__file__).parent / "guard"


@pytest.fixture(autouse=True)
def sandbox_only_in_slow_tests(request, monkeypatch):
    """A test outside -m slow that starts a sandbox fails, here or in a Python process it
    starts (tests/guard/no_sandbox.py): the slow marker is what keeps the fast loop fast."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    no_sandbox.install()
    monkeypatch.setenv(no_sandbox.ENV, request.node.nodeid)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(GUARD), *filter(None, [os.environ.get("PYTHONPATH")])]))
    yield
