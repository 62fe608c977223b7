"""Fixtures shared by the grader's own tests; helpers live in tests/helpers.py."""

from __future__ import annotations

import pytest

from helpers import SharedZygote
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
