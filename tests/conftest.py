"""Fixtures shared by the grader's own tests; helpers live in tests/helpers.py."""

from __future__ import annotations

import pytest

from helpers import SharedTrainings, SharedZygote
from grader import paths
from grader.rubric import load_rubric


@pytest.fixture(scope="session")
def rubric():
    return load_rubric(paths.RUBRIC)


@pytest.fixture(scope="session")
def zygote(rubric):
    """One torch-loaded zygote for the tests that only grade (import torch is paid once);
    restarted if a test left it dead (helpers.SharedZygote)."""
    shared = SharedZygote(forbidden=rubric.all_forbidden)
    try:
        yield shared
    finally:
        shared.close()


# Whole modules, and the fixtures, that make a test slow (pytest -m "not slow" leaves them).
SLOW_MODULES = {"test_attacks.py", "test_batch.py", "test_environment.py"}
SLOW_FIXTURES = {"autograder_zip", "release", "graded_course"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.path.name
        if module == "test_attacks.py":
            item.add_marker(pytest.mark.attacks)
        if module in SLOW_MODULES or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) \
                or item.get_closest_marker("nbgrader"):
            item.add_marker(pytest.mark.slow)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("mode") == "root" or item.get_closest_marker("root"):
            item.add_marker(pytest.mark.root)


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
