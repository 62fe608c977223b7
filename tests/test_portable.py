"""The portable backend (grader.sandbox.portable): students' laptops without the Linux jail.

Run for real here (``PortableZygote``, forced), and with the modules and calls a Windows or
macOS Python lacks taken away (tests/foreign_python.py) for every student command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grader import paths
from grader.course import Course
from grader.grading import Grader
from grader.sandbox.backends import (BACKENDS, MODE_NAMES, backend_name, jail_missing,
                                     requested_mode)
from grader.errors import NeedsJail, SandboxModeError
from tests.helpers import fixture_names, labs_changed, make_submission, run_cli

FOREIGN = Path(__file__).with_name("foreign_python.py")
PUBLIC = ("public",)


def foreign(platform: str, *argv, cwd=None) -> subprocess.CompletedProcess:
    """``grader *argv`` in a Python made to lack what ``platform``'s lacks."""
    env = {k: v for k, v in os.environ.items() if k != "GRADER_SANDBOX_MODE"}
    return subprocess.run([sys.executable, str(FOREIGN), platform, *map(str, argv)],
                          capture_output=True, text=True, env={**env, "COLUMNS": "200"},
                          cwd=cwd or paths.KIT, timeout=600)


def test_an_unknown_mode_is_refused_in_one_error_line():
    got = run_cli("check", "solutions/lab1_attention.py", cwd=paths.KIT,
                  env={"GRADER_SANDBOX_MODE": "portible"})
    assert got.returncode == 2
    assert got.stderr.strip().splitlines() == [
        "error: GRADER_SANDBOX_MODE='portible' is not a sandbox mode; use one of "
        "auto, root, userns, plain, portable"]
    assert got.stdout == ""         # refused before anything ran


def test_modes_and_the_table_agree():
    assert requested_mode({}) == "auto" and requested_mode({"GRADER_SANDBOX_MODE": ""}) == "auto"
    for mode in MODE_NAMES:
        assert requested_mode({"GRADER_SANDBOX_MODE": mode}) == mode
    with pytest.raises(SandboxModeError):
        requested_mode({"GRADER_SANDBOX_MODE": "Plain"})
    assert backend_name("portable") == "portable"
    # This Linux has what the jail needs: auto is the jail, and only the jail grades.
    assert jail_missing() == [] and backend_name("auto") in ("jail", "portable")
    assert BACKENDS["jail"].grades_for_points and not BACKENDS["portable"].grades_for_points


@pytest.mark.slow
def test_grading_for_points_is_refused_on_the_portable_backend(monkeypatch):
    monkeypatch.setenv("GRADER_SANDBOX_MODE", "portable")
    rubric = Course(paths.KIT).rubric
    with pytest.raises(NeedsJail, match="for points needs the Linux sandbox"):
        Grader(Course(paths.KIT, rubric))
    with pytest.raises(NeedsJail):       # public tests alone, for points (nbgrader, Classroom)
        Grader(Course(paths.KIT, rubric), visibility=PUBLIC, graded=True)
    for command in (["grade", "solutions", "--out", "out"], ["batch", "examples/submissions",
                                                             "--out", "out"]):
        got = run_cli(*command, cwd=paths.KIT)
        assert got.returncode == 2, got
        assert len(got.stderr.strip().splitlines()) == 1
        assert got.stderr.startswith(f"error: grader {command[0]} grades for points")


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["windows", "macos"])
def test_every_student_command_starts_without_the_jail(platform, tmp_path):
    for argv in (["--help"], ["--version"], ["check", "--help"], ["feedback", "--help"]):
        got = foreign(platform, *argv)
        assert got.returncode == 0 and "Traceback" not in got.stderr, (argv, got.stderr)
    got = foreign(platform, "check", "solutions/lab1_attention.py")
    assert got.returncode == 0 and "Traceback" not in got.stderr + got.stdout, got.stderr
    assert "lab1: 7/7 public tests pass" in got.stdout
    # A folder, --lab, a stub (failing: exit 1, not a traceback), feedback.
    got = foreign(platform, "check", "solutions", "--lab", "lab3_positional")
    assert got.returncode == 0 and "lab3: 6/6 public tests pass" in got.stdout, got.stderr
    got = foreign(platform, "check", "exercises/lab2_multihead.py")
    assert got.returncode == 1 and "Traceback" not in got.stderr + got.stdout
    assert "lab2: 0/6 public tests pass" in got.stdout
    got = foreign(platform, "feedback", "solutions", "--lab", "lab1_attention",
                  "--out", tmp_path)
    assert got.returncode == 0 and (tmp_path / "feedback.html").is_file(), got.stderr
    assert "covers the public tests" in got.stdout
    for command in (["grade", "solutions", "--out", tmp_path], ["classroom", "solutions"]):
        got = foreign(platform, *command)
        assert got.returncode == 2 and "Traceback" not in got.stderr
        assert got.stderr.startswith(f"error: grader {command[0]} grades for points")


@pytest.mark.slow
def test_a_resource_test_is_measured_when_graded_where_the_kernel_shows_nothing():
    """No /proc (Windows): lab 6's memory test is neither passed nor failed, and its
    points are out of the check's total; the other tests pass as in the jail."""
    got = foreign("windows", "check", "solutions", "--lab", "lab6_efficient_attention")
    assert got.returncode == 0, got.stdout + got.stderr
    row = next(line for line in got.stdout.splitlines()
               if "test_chunked_attention_memory_stays_linear" in line)
    assert "later" in row and "-/4" in row
    assert "lab6: 7/7 public tests pass, 1 measured when graded" in got.stdout
    assert "Total: 7/7" in got.stdout


def _outcomes(result, rubric) -> list[tuple]:
    """What a student reads of each test. A resource test's figures are the machine's
    (a cgroup's peak in the jail, the resident size in the portable backend's worker): its
    verdict and points must agree, and its message on both says what the figures show."""
    return [(t.lab, t.name, t.passed, t.score, t.max_score, t.diagnosis,
             "(figures)" if rubric.labs[t.lab].tests[t.name].budget else t.message)
            for lab in result.labs for t in lab.tests]


def _portable_grader(rubric):
    from grader.sandbox.portable import PortableZygote
    zygote = PortableZygote(forbidden=rubric.all_forbidden)
    return zygote, Grader(Course(paths.KIT, rubric), zygote=zygote, visibility=PUBLIC)


BUG_FILES = fixture_names("bug_")


# The agreement test in parts, so that parallel test processes share it (one part took
# 142 s of a 21-minute suite); together they cover the solutions, the stubs and every bug
# file (test_the_parts_cover_every_bug_file).
PARTS = 4


def _part(index: int) -> list[str]:
    return ["solutions", "exercises", *BUG_FILES][index::PARTS]


def test_the_parts_cover_every_bug_file():
    names = sorted(n for i in range(PARTS) for n in _part(i))
    assert names == sorted(["solutions", "exercises", *BUG_FILES]) and len(BUG_FILES) > 38


@pytest.mark.slow
@pytest.mark.parametrize("part", range(PARTS))
def test_the_portable_backend_agrees_with_the_jail_test_by_test(part, rubric, zygote, tmp_path):
    """Solutions, stubs and every bug file (a quarter of them here): the same pass/fail,
    points, message and diagnosis on both backends (lab 8's training on the solutions only:
    a bug file's lab 8 trains twice as long as everything else here)."""
    submissions = []
    for name in _part(part):
        if name in ("solutions", "exercises"):
            submissions.append((paths.KIT / name, None))
            continue
        labs = [lab for lab in labs_changed(name, rubric) if lab != "lab8_train_transformer"]
        if labs:
            submissions.append((make_submission(name, tmp_path / name), labs))
    portable_zygote, portable = _portable_grader(rubric)
    differ = []
    try:
        with Grader(Course(paths.KIT, rubric), zygote=zygote, visibility=PUBLIC) as jail:
            for folder, labs in submissions:
                want = _outcomes(jail.grade(folder, labs=labs), rubric)
                got = _outcomes(portable.grade(folder, labs=labs), rubric)
                if got != want:
                    differ.append((folder.name, [(g, w) for g, w in zip(got, want, strict=False)
                                                 if g != w]))
    finally:
        portable.close()
        portable_zygote.close()
    assert differ == []
    assert len(submissions) >= 12


LAB8 = "lab8_train_transformer"
LAB8_BUG_FILES = [name for name in BUG_FILES if name.startswith("bug_lab8_")]


@pytest.mark.slow
@pytest.mark.parametrize("name", LAB8_BUG_FILES)
def test_the_backends_agree_on_lab8s_bug_files(name, rubric, zygote, tmp_path):
    """Lab 8's bug files, one per test (each trains on both backends, ~13 s apiece):
    the same pass/fail, points, message and diagnosis as in the jail."""
    folder = make_submission(name, tmp_path / name)
    portable_zygote, portable = _portable_grader(rubric)
    try:
        with Grader(Course(paths.KIT, rubric), zygote=zygote, visibility=PUBLIC) as jail:
            want = _outcomes(jail.grade(folder, labs=[LAB8]), rubric)
        got = _outcomes(portable.grade(folder, labs=[LAB8]), rubric)
    finally:
        portable.close()
        portable_zygote.close()
    assert got == want and len(want) >= 4      # every public test of lab 8, compared


@pytest.mark.slow
def test_a_hang_costs_one_test_and_a_fresh_worker_serves_the_next(rubric, tmp_path):
    """A worker that never answers is killed at the time limit; the next test's worker is
    new (a spare, started ahead), so the lab's other tests still run."""
    sub = tmp_path / "hang"
    sub.mkdir()
    source = (paths.KIT / "solutions" / "lab1_attention.py").read_text() + (
        # Only the 4-d case hangs, in a busy loop: CPU the time limit must stop.
        "\n_real = scaled_dot_product_attention\n"
        "def scaled_dot_product_attention(q, k, v, *a, **kw):\n"
        "    if q.dim() == 4:\n"
        "        while True:\n"
        "            pass\n"
        "    return _real(q, k, v, *a, **kw)\n")
    (sub / "lab1_attention.py").write_text(source)
    portable_zygote, portable = _portable_grader(rubric)
    try:
        result = portable.grade(sub, labs=["lab1_attention"])
    finally:
        portable.close()
        portable_zygote.close()
    by_name = {t.name: t for t in result.labs[0].tests}
    assert not by_name["test_matches_pytorch_4d_heads"].passed
    assert "time limit" in by_name["test_matches_pytorch_4d_heads"].message
    assert by_name["test_matches_pytorch_3d"].passed and by_name["test_causal_mask_square"].passed
    assert sum(not t.passed for t in result.labs[0].tests) == 1


@pytest.mark.slow
def test_a_workers_cpu_time_comes_from_the_os_where_there_is_no_proc(rubric):
    """Lab 8's budget on macOS and Windows: the worker's CPU when it connected (torch's
    import, before any student code) is the baseline, its reaped total the end."""
    from grader.sandbox.portable import PortableZygote
    with PortableZygote(forbidden=rubric.all_forbidden) as zygote:
        worker = zygote.spawn(submission=str(paths.KIT / "solutions"), lab="lab1_attention",
                              forbidden=[])
        start = worker.process.cpu_ns(final=False)
        end = worker.process.cpu_ns(final=True)
        worker.kill()
        assert worker.process.popen.poll() is not None      # ended, and reaped
    assert 0.2e9 < start <= end < start + 5e9      # importing torch costs CPU; little since


@pytest.mark.slow
@pytest.mark.parametrize("name", ["atk_sigchld_ign_fork_window", "atk_sigchld_ign_fork_generate"])
def test_a_fork_is_refused_with_the_jails_words(name, rubric, zygote, tmp_path):
    """os.fork in the student's code: PermissionError on both backends, with the same
    words (the worker's audit hook; the jail's seccomp refuses every other route too)."""
    folder = make_submission(name, tmp_path / name)
    labs = labs_changed(name, rubric)
    portable_zygote, portable = _portable_grader(rubric)
    try:
        with Grader(Course(paths.KIT, rubric), zygote=zygote, visibility=PUBLIC) as jail:
            want = _outcomes(jail.grade(folder, labs=labs), rubric)
        got = _outcomes(portable.grade(folder, labs=labs), rubric)
    finally:
        portable.close()
        portable_zygote.close()
    assert got == want
    assert any("runs in this one process" in str(outcome) for outcome in want), want


# Through libc, past the worker's audit hook: the portable backend has no seccomp, so a
# determined student's child exists there; it must still end with the worker.
DETACHING_LAB1 = '''
import ctypes, os, time

_fork = ctypes.CDLL(None).fork

def _detach(pid_file):
    if _fork() == 0:
        os.setsid()                     # a session of its own: out of the worker's group
        if _fork() == 0:
            with open(pid_file, "a") as fh:
                fh.write(f"{os.getpid()}\\n")
            time.sleep(120)
        os._exit(0)

_detach(PID_FILE)
'''


@pytest.mark.slow
def test_nothing_the_students_code_started_outlives_a_portable_check(rubric, tmp_path):
    """A double fork into a session of its own (atk: setsid daemon) ends with the worker:
    the worker is its children's subreaper, and the grader ends every descendant."""
    pid_file = tmp_path / "pids"
    sub = tmp_path / "sub"
    sub.mkdir()
    source = (paths.KIT / "solutions" / "lab1_attention.py").read_text()
    (sub / "lab1_attention.py").write_text(
        f"PID_FILE = {str(pid_file)!r}\n" + DETACHING_LAB1 + source)
    portable_zygote, portable = _portable_grader(rubric)
    try:
        result = portable.grade(sub, labs=["lab1_attention"])
    finally:
        portable.close()
        portable_zygote.close()
    pids = [int(p) for p in pid_file.read_text().split()]
    assert pids and result.labs[0].tests
    alive = []
    for pid in pids:        # ours: started by this test's submission, ended by their pid
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
            os.kill(pid, 9)
    assert alive == []
