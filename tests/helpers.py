"""Helpers shared by the grader's own tests (import them: ``from helpers import ...``).

Fixture submissions (tests/fixtures/submissions/<name>/) hold only the files that differ
from the reference solutions; ``make_submission`` lays the reference down first, then the
fixture's files, then deletes what its expect.yaml lists under ``delete``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from grader import paths
from grader.course import Course
from grader.grading import VISIBILITIES, Grader
from grader.results import SubmissionResult, is_grader_fault
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
    for f in sorted((paths.KIT / "solutions").glob("lab*.py")):
        shutil.copyfile(f, dest / f.name)
    for f in sorted((FIXTURES / name).iterdir()):
        if f.suffix == ".py":
            shutil.copyfile(f, dest / f.name)
    for gone in expectation(name).get("delete", []) or []:
        (dest / gone).unlink()
    return dest


def labs_changed(name: str, rubric) -> list[str]:
    """The labs whose files fixture ``name`` replaces or deletes, in the rubric's order; all
    of them if it adds any other file (a module every lab could import). The other labs
    are the reference's own files, and a lab's points depend on its own file only
    (tests/test_grading.py::test_a_labs_points_depend_on_its_own_code_only), so grading
    these is grading everything the fixture can change."""
    files = {f.name for f in (FIXTURES / name).glob("*.py")} | \
        set(expectation(name).get("delete") or [])
    by_file = {lab.file: lab_name for lab_name, lab in rubric.labs.items()}
    if not files <= set(by_file):
        return list(rubric.labs)
    return [lab for lab in rubric.labs if rubric.labs[lab].file in files]


def unbudgeted_labs(rubric) -> list[str]:
    """The labs whose tests have no budget: no measured calls, no training (~2 s of a
    grading instead of ~20). Tests of what is the same for every lab (a batch's
    bookkeeping, a course's own inputs, a pytest session shared between students) grade
    these; the budgeted labs have tests of their own."""
    labs = [name for name, lab in rubric.labs.items()
            if not any(t.budget for t in lab.tests.values())]
    assert "lab8_train_transformer" not in labs and len(labs) >= 4
    return labs


def grade(submission, *, rubric, zygote, labs=None, visibility=VISIBILITIES, name=None,
          send_ahead: bool = False) -> SubmissionResult:
    """Grade one submission as ``grader grade`` does, on a zygote the test shares."""
    with Grader(Course(paths.KIT, rubric), zygote=zygote, visibility=visibility, send_ahead=send_ahead) as grader:
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



class SharedGradings:
    """Gradings of fixture submissions shared by the tests of one process: ``(name, labs)``
    -> ``(SubmissionResult, captured)``, graded as ``grade`` does on the shared zygote.

    test_feedback (the diagnoses), test_grading (the points) and test_call_plan (one call
    at a time) each asked for the same gradings: one grading now serves them all. Only a
    grading that came out as the fixture's expect.yaml says (the labs it ``breaks`` lose
    points, every other lab keeps full marks, no grader or platform fault) is kept: any
    other result goes back to the test that asked for it alone, and the next test grades
    afresh, so a test slowed past a time limit under load fails only itself.

    ``captured``: for a correct submission (the solutions, an ``ok_`` fixture), every
    test's calls as (lab, test, tolerance, calls), for test_feedback's forced-diagnosis
    check; None for the others."""

    def __init__(self, rubric, zygote, tmp_root: Path):
        self.rubric, self.zygote, self.tmp_root = rubric, zygote, tmp_root
        self.kept: dict = {}

    def __call__(self, name: str, labs=None):
        chosen = None if labs is None else tuple(lab for lab in self.rubric.labs if lab in labs)
        key = (name, chosen)
        if key in self.kept:
            return self.kept[key]
        got = self._grade(name, chosen, capture=name == "solutions" or name.startswith("ok_"))
        if self._as_expected(name, got[0]):
            self.kept[key] = got
        return got

    def _grade(self, name: str, labs, capture: bool):
        from grader.engine.plugin import GradingPlugin, lab_of

        folder = {"solutions": paths.KIT / "solutions",
                  "exercises": paths.KIT / "exercises"}.get(name)
        if folder is None:
            folder = make_submission(name, Path(tempfile.mkdtemp(prefix=f"{name}-",
                                                                 dir=self.tmp_root)))
        captured = [] if capture else None

        def teardown(plugin, item):
            captured.append((lab_of(item), item.originalname,
                             plugin._rubric_test(item).tolerance, list(plugin.session.calls)))

        with contextlib.ExitStack() as stack:
            if capture:
                mp = stack.enter_context(pytest.MonkeyPatch.context())
                mp.setattr(GradingPlugin, "pytest_runtest_teardown", teardown, raising=False)
            result = grade(folder, rubric=self.rubric, zygote=self.zygote,
                           labs=list(labs) if labs else None, name=name)
        return result, captured

    def _as_expected(self, name: str, result: SubmissionResult) -> bool:
        """Whether ``result`` is what the fixture's expect.yaml says it is."""
        if name != "solutions" and not (FIXTURES / name / "expect.yaml").is_file():
            return False
        breaks = set(expectation(name).get("breaks") or ()) if name != "solutions" else set()
        if result.fault is not None or not result.labs:
            return False
        for lab in result.labs:
            if is_grader_fault(lab.fault):
                return False
            if (lab.score < lab.max_score) != (lab.name in breaks):
                return False
        return True


class SharedTrainings:
    """Successful trainings shared between the tests of one process, keyed on (lab, the lab
    file's bytes, the request): train() is deterministic for a given file and seed, so a
    rerun would give the same weights (tests/test_lab8.py checks that on the reference).
    Only successes are kept: a StudentError (a timeout under load, a crash) goes back to
    its own test and the next test trains afresh. ``method()`` replaces
    ``Session._train_once``; its ``__wrapped__`` is the original, for a test that must
    train afresh."""

    def __init__(self, original):
        self.original = original
        self.done: dict = {}

    def train_once(self, session, lab: str, req: dict):
        from grader.engine.student import StudentError
        from grader.sandbox import wire
        path = Path(session.submission_dir) / f"{lab}.py"
        try:
            key = (lab, hashlib.sha256(path.read_bytes()).hexdigest(), wire.encode(req))
        except OSError:
            return self.original(session, lab, req)
        if key in self.done:
            return self.done[key]
        got = self.original(session, lab, req)
        if not isinstance(got, StudentError):
            self.done[key] = got
        return got

    def method(self):
        """A function to set as ``Session._train_once`` (bound to each session)."""
        def _train_once(session, lab, req):
            return self.train_once(session, lab, req)
        _train_once.__wrapped__ = self.original
        return _train_once


def run_cli(*argv, cwd=None, env: dict | None = None) -> subprocess.CompletedProcess:
    """``grader *argv`` in this process, through ``grader.cli.main`` (no interpreter to
    start, no second ``import torch``): the exit status and what it printed, as
    ``subprocess.run(..., capture_output=True, text=True)`` gives them. The environment
    (``--course`` writes it) and the working folder are put back afterwards. For the entry
    point itself, signals and the exit status a process ends with, start a process."""
    from grader.cli import main

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    os.environ.update({"COLUMNS": "200", **(env or {})})
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as exc:       # argparse: --help, --version, a usage error
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["grader", *map(str, argv)], code, out.getvalue(),
                                       err.getvalue())


def grading_bound_s(rubric, labs=None) -> float:
    """The longest one submission's grading may take by the grader's own limits, in wall
    seconds: every test of ``labs`` (default: all) ends by its time limit, and a grading
    process is given START_TIMEOUT_S to start (torch, a zygote). A test waiting for a
    grading to finish waits this long: a fixed guess is what failed under load."""
    from grader.batch.pool import START_TIMEOUT_S
    chosen = list(rubric.labs) if labs is None else labs
    return START_TIMEOUT_S + sum(t.time_limit_s for lab in chosen
                                 for t in rubric.labs[lab].tests.values())
