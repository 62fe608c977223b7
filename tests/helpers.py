"""Helpers shared by the grader's own tests (import them: ``from helpers import ...``).

Fixture submissions (tests/fixtures/submissions/<name>/) hold only the files that differ
from the reference solutions; ``make_submission`` lays the reference down first, then the
fixture's files, then deletes what its expect.yaml lists under ``delete``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from grader import paths
from grader.grading import VISIBILITIES, Grader
from grader.results import SubmissionResult
from grader.sandbox import Zygote

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


def grade(submission, *, rubric, zygote, labs=None, visibility=VISIBILITIES, name=None,
          send_ahead: bool = False) -> SubmissionResult:
    """Grade one submission as ``grader grade`` does, on a zygote the test shares."""
    with Grader(rubric, zygote=zygote, visibility=visibility, send_ahead=send_ahead) as grader:
        return grader.grade(submission, labs=labs, name=name)


class SharedZygote:
    """The test session's zygote, shared by tests that only grade: started once (import
    torch is paid once), and started again before the next use if a test left it dead,
    so one test that kills it cannot fail the tests after it. A test that kills or
    poisons a sandbox on purpose starts a ``Zygote`` of its own instead."""

    def __init__(self, **options):
        self.options = options
        self.zygote = Zygote(**options).start()
        self.restarts = 0

    def _live(self) -> Zygote:
        if not self.zygote.alive:
            self.zygote.close()
            self.zygote = Zygote(**self.options).start()
            self.restarts += 1
        return self.zygote

    def spawn(self, **kwargs):
        return self._live().spawn(**kwargs)

    def __getattr__(self, name):
        return getattr(self.zygote, name)

    def close(self) -> None:
        self.zygote.close()
