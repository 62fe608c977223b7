"""Shared fixtures for the grader's own tests.

Fixture submissions (tests/fixtures/submissions/<name>/) hold only the files that differ
from the reference solutions; ``make_submission`` lays the reference down first, then the
fixture's files, then deletes what its expect.yaml lists under ``delete``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from grader import paths
from grader.rubric import load_rubric

FIXTURES = Path(__file__).parent / "fixtures" / "submissions"


def fixture_names(prefix: str = "") -> list[str]:
    return sorted(p.name for p in FIXTURES.iterdir()
                  if p.is_dir() and p.name.startswith(prefix) and (p / "expect.yaml").is_file())


def expectation(name: str) -> dict:
    return yaml.safe_load((FIXTURES / name / "expect.yaml").read_text()) or {}


def make_submission(name: str, dest: Path) -> Path:
    """Reference solutions overlaid with fixture ``name``; returns the submission folder."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(paths.SOLUTIONS.glob("lab*.py")):
        shutil.copyfile(f, dest / f.name)
    for f in sorted((FIXTURES / name).iterdir()):
        if f.suffix == ".py":
            shutil.copyfile(f, dest / f.name)
    for gone in expectation(name).get("delete", []) or []:
        (dest / gone).unlink()
    return dest


@pytest.fixture(scope="session")
def rubric():
    return load_rubric(paths.RUBRIC)


@pytest.fixture(scope="session")
def zygote(rubric):
    """One torch-loaded zygote for the whole test session (import torch is paid once)."""
    from grader.sandbox import Zygote

    forbidden = tuple(sorted({f for lab in rubric.labs.values() for f in lab.forbidden}))
    with Zygote(forbidden=forbidden) as z:
        yield z
