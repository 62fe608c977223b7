"""Tests of grader/authoring/bundles.py and the Gradescope runner (grader/autograder/).

The student release is checked for secrets by a scan written here, independently of the one
``build_release`` runs, and its ``grader check`` is run from the unpacked bundle with the
bundle's own code. The Gradescope zip is unpacked into an emulated /autograder under a
temporary root and its ``run_autograder`` is run there, as Gradescope would, on correct,
buggy, broken, hostile and hanging submissions; every results.json is validated against
tests/data/gradescope_results.schema.json.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from helpers import make_submission
from grader import paths
from grader.course import Course
from grader.authoring.bundles import build_gradescope, build_release
from grader.errors import BundleError
from grader.rubric import load_rubric
from grader.authoring.stubs import solution_regions
from grader.secret import SECRET_FILE, course_secret

SCHEMA = Path(__file__).parent / "data" / "gradescope_results.schema.json"
RUN_TIMEOUT_S = 180


def _raw_rubric() -> dict:
    return yaml.safe_load((paths.KIT / "rubric.yaml").read_text(encoding="utf-8"))


def _tests_by_visibility(visibility: str) -> dict[str, set[str]]:
    return {lab: {n for n, t in spec["tests"].items() if t["visibility"] == visibility}
            for lab, spec in _raw_rubric()["labs"].items()}


# ======================================================================================
# grader release
# ======================================================================================


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    return build_release(tmp_path_factory.mktemp("release") / "labs", Course(paths.KIT))


def _bundle_env(bundle: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GRADER_"))}
    # COLUMNS: a table as wide as the messages the tests look for; otherwise its width is
    # whatever the test process inherited (80 under pytest-xdist) and a reason is wrapped.
    env.update(PYTHONPATH=str(bundle), GRADER_COURSE_DIR=str(bundle),
               PYTHONDONTWRITEBYTECODE="1", COLUMNS="200")
    return env


def test_release_holds_what_check_needs_and_no_hidden_suite_or_solution(release):
    assert sorted(p.name for p in (release / "exercises").glob("lab*.py")) == \
        sorted(p.name for p in (paths.KIT / "exercises").glob("lab*.py"))
    assert sorted(p.name for p in (release / "grader" / "suites" / "public").glob("*.py")) == \
        sorted(p.name for p in (paths.SUITES / "public").glob("*.py"))
    for needed in ("grader/cli/__init__.py", "grader/cli/check.py", "grader/grading.py",
                   "grader/errors.py", "grader/intake/__init__.py", "grader/outputs/terminal.py",
                   "grader/authoring/stubs.py", "grader/authoring/validate.py",
                   "grader/sandbox/zygote.py", "grader/suites/_inputs.py",
                   "grader/suites/pytest.ini", "pyproject.toml", "requirements.txt", "README.md",
                   "rubric.yaml"):
        assert (release / needed).is_file(), needed
    assert not (release / "grader" / "suites" / "hidden").exists()
    assert not (release / "solutions").exists()
    # Never the course secret (hidden inputs derive from it), by name or by value.
    secret = course_secret(paths.KIT).hex().encode()
    assert not [p for p in release.rglob("*") if p.name == SECRET_FILE or (
        p.is_file() and secret in p.read_bytes())]
    assert not list(release.rglob("__pycache__")) and not list(release.rglob("*.pyc"))
    # The Classroom workflow is opt-in; the three-OS check always ships.
    assert [p.name for p in (release / ".github" / "workflows").iterdir()] == ["check.yml"]


def test_release_rubric_lists_only_public_tests_and_their_points(release):
    public = load_rubric(release / "rubric.yaml")
    full = load_rubric((paths.KIT / "rubric.yaml"))
    assert list(public.labs) == list(full.labs)
    for name, lab in full.labs.items():
        expected = {n: t.points for n, t in lab.tests.items() if t.visibility == "public"}
        assert {n: t.points for n, t in public.labs[name].tests.items()} == expected
        assert all(t.visibility == "public" for t in public.labs[name].tests.values())
        assert public.labs[name].forbidden == lab.forbidden


def _public_lines() -> set[str]:
    """Lines students get anyway: given code of the solution files, public suites."""
    lines = set()
    for f in (paths.KIT / "solutions").glob("lab*.py"):
        text = f.read_text(encoding="utf-8").splitlines()
        inside = set()
        for region in solution_regions("\n".join(text) + "\n", path=str(f)):
            inside |= set(range(region.start_line, region.end_line + 1))
        lines |= {line.strip() for i, line in enumerate(text, 1) if i not in inside}
    for f in list(paths.SUITES.glob("*.py")) + list((paths.SUITES / "public").glob("*.py")):
        lines |= {line.strip() for line in f.read_text(encoding="utf-8").splitlines()}
    return lines


def _says_something(line: str) -> bool:
    """Not an import, a separator or a short generic statement."""
    return (len(line) >= 12 and not re.match(r"(import|from)\s", line)
            and len(re.findall(r"[A-Za-z_]\w*", line)) >= 2)


def test_release_contains_no_hidden_name_solution_line_or_hidden_suite_line(release):
    public_names = set().union(*_tests_by_visibility("public").values())
    hidden_names = set().union(*_tests_by_visibility("hidden").values()) - public_names
    assert hidden_names, "the rubric has hidden tests to look for"
    given = _public_lines()
    solution_lines = set()
    for f in (paths.KIT / "solutions").glob("lab*.py"):
        for region in solution_regions(f.read_text(encoding="utf-8"), path=str(f)):
            solution_lines |= {s for line in region.code_lines
                               if _says_something(s := line.strip())}
    hidden_lines = {s for f in (paths.SUITES / "hidden").glob("*.py")
                    for line in f.read_text(encoding="utf-8").splitlines()
                    if _says_something(s := line.strip())}
    assert solution_lines - given and hidden_lines - given, "there are secrets to look for"

    found = []
    files = [p for p in release.rglob("*") if p.is_file()]
    assert len(files) > 20
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="replace")
        for name in hidden_names:
            if re.search(rf"\b{re.escape(name)}\b", text):
                found.append(f"{path}: hidden test name {name}")
        for line in {line.strip() for line in text.splitlines()}:
            if line in solution_lines - given:
                found.append(f"{path}: solution line {line!r}")
            if line in hidden_lines - given:
                found.append(f"{path}: hidden suite line {line!r}")
    assert found == []


def test_release_refuses_to_publish_a_leak(tmp_path):
    package = tmp_path / "grader"
    shutil.copytree(paths.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    for suite in (package / "suites" / "public").glob("*.py"):
        if "grader.engine.reference" in suite.read_text():
            suite.unlink()  # refused for another reason (see the next test)
    hidden = sorted(set().union(*_tests_by_visibility("hidden").values()))[0]
    (package / "notes.py").write_text(f"# TODO: explain {hidden} in the feedback\n")
    out = tmp_path / "release"
    with pytest.raises(BundleError, match=rf"notes.py:1: hidden test name {hidden}"):
        build_release(out, Course(paths.KIT), package=package)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["grader"]  # no half-built folder left


def test_release_refuses_public_suites_that_need_the_solutions(tmp_path):
    package = tmp_path / "grader"
    shutil.copytree(paths.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "suites" / "public" / "test_lab9_extra.py").write_text(
        "from grader.engine.reference import load_reference\n\n\ndef test_x(student):\n"
        "    load_reference('lab9_extra')\n")
    with pytest.raises(BundleError, match=r"test_lab9_extra\.py:1"):
        build_release(tmp_path / "release", Course(paths.KIT), package=package)
    assert not (tmp_path / "release").exists()


def test_release_will_not_overwrite_a_folder(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(BundleError, match="already exists"):
        build_release(tmp_path / "out", Course(paths.KIT))
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_release_classroom_workflow_fetches_the_grader_from_a_secret(tmp_path):
    out = build_release(tmp_path / "labs", Course(paths.KIT), classroom_workflow=True)
    workflow = yaml.safe_load((out / ".github" / "workflows" / "classroom.yml").read_text())
    steps = workflow["jobs"]["run-autograding-tests"]["steps"]
    text = json.dumps(steps)
    assert "secrets.GRADER_BUNDLE_URL" in text
    grade = next(s for s in steps if s.get("id") == "labs")
    # The bundle is the course, named on the command line (not through the environment).
    assert 'grader.cli --course "$RUNNER_TEMP/grader" classroom' in grade["run"]
    assert "--github-output" in grade["run"] and "GRADER_COURSE_DIR" not in grade["run"]
    # The grader runs from the downloaded bundle, never from the student's checkout.
    assert grade["working-directory"] == "${{ runner.temp }}/grader"
    assert "PYTHONPATH=$RUNNER_TEMP/grader" in grade["run"]
    reporter = steps[-1]
    assert reporter["uses"].startswith("classroom-resources/autograding-grading-reporter")
    assert reporter["with"]["runners"] == "labs"
    assert reporter["env"]["LABS_RESULTS"] == "${{ steps.labs.outputs.result }}"


def test_release_ships_a_check_workflow_for_linux_macos_and_windows(release):
    """.github/workflows/check.yml (#40): a matrix of the three OSes, Python 3.11, the kit
    installed as the README says, and `grader check` run with arguments the CLI takes, in
    bash everywhere; the stubs' exit 1 without a traceback is a success, exit 2 is not."""
    import shlex

    from grader.cli import build_parser

    text = (release / ".github" / "workflows" / "check.yml").read_text(encoding="utf-8")
    workflow = yaml.safe_load(text)
    assert "push" in workflow.get("on", workflow.get(True))     # YAML 1.1 reads on: as True
    (job,) = workflow["jobs"].values()
    matrix = job["strategy"]["matrix"]
    assert set(matrix["os"]) == {"ubuntu-latest", "macos-latest", "windows-latest"}
    assert job["runs-on"] == "${{ matrix.os }}" and job["strategy"]["fail-fast"] is False
    assert job["defaults"]["run"]["shell"] == "bash"
    steps = job["steps"]
    setup = next(s for s in steps if s.get("uses", "").startswith("actions/setup-python@"))
    assert setup["with"]["python-version"] == "3.11"
    runs = [s["run"] for s in steps if "run" in s]
    assert all("shell" not in s or s["shell"] == "bash" for s in steps)
    install = next(r for r in runs if "pip install" in r)
    assert "-e ." in install and "torch" not in install        # the pyproject pins torch
    assert "torch==2.13.0" in (release / "pyproject.toml").read_text()
    assert not re.search(r"https?://|pypi|pytorch\.org", text)  # no registry host written in
    commands = [shlex.split(line.split("|")[0].strip()) for r in runs for line in r.splitlines()
                if line.strip().startswith("grader ")]
    assert [c[:2] for c in commands] == [["grader", "--version"], ["grader", "check"]]
    parser = build_parser()
    for command in commands:
        argv = [a for a in command[1:] if a != "2>&1"]
        try:
            parser.parse_args(argv)
        except SystemExit as exc:                   # --version prints and exits 0; a bad
            assert exc.code == 0, command           # argument exits 2
        paths_named = [a for a in argv[1:] if not a.startswith("-")]
        assert all((release / a).exists() for a in paths_named), paths_named
    check = next(r for r in runs if "grader check" in r)
    # What the step accepts, run in bash with a stand-in `grader`: a check that printed its
    # lab summaries and exited 0 or 1 (the stubs fail), never a traceback or exit 2.
    for printed, status, ok in [("lab1: 0/7 public tests pass", 1, True),
                                ("lab1: 7/7 public tests pass", 0, True),
                                ("error: no such lab", 2, False),
                                ("Traceback (most recent call last):\nlab1: 0/7", 1, False),
                                ("", 1, False)]:
        with tempfile.TemporaryDirectory() as tmp:
            fake = Path(tmp) / "grader"
            fake.write_text(f"#!/bin/sh\nprintf '%s\\n' {shlex.quote(printed)}\nexit {status}\n")
            fake.chmod(0o755)
            # As Actions runs a `shell: bash` step.
            got = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                                  check], cwd=tmp, capture_output=True, text=True,
                                 env={**os.environ, "PATH": f"{tmp}:{os.environ['PATH']}"})
        assert (got.returncode == 0) == ok, (printed, status, got.stdout, got.stderr)
    # The README gives each OS's set-up and check lines, and what differs off Linux.
    readme = " ".join((release / "README.md").read_text(encoding="utf-8").split())
    for line in ("python3 -m venv .venv", ".venv/bin/pip install -e .", ".venv/bin/grader check",
                 "py -3.11 -m venv .venv", ".venv\\Scripts\\pip install -e .",
                 ".venv\\Scripts\\grader check", "portable backend", "`later -/N`",
                 "measured when your work is graded", "no points shown as lost",
                 ".github/workflows/check.yml"):
        assert line in readme, line
    kit_readme = " ".join((paths.KIT / "README.md").read_text(encoding="utf-8").split())
    for line in (".venv/bin/grader check", "py -3.11 -m venv .venv",
                 ".venv\\Scripts\\grader check", "measured when your work is graded"):
        assert line in kit_readme, line


def test_grader_check_runs_from_the_unpacked_bundle(release, tmp_path):
    env = _bundle_env(release)
    where = subprocess.run([sys.executable, "-c", "import grader; print(grader.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(release)

    stubs = subprocess.run([sys.executable, "-m", "grader.cli", "check"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert stubs.returncode == 1, stubs.stdout + stubs.stderr
    assert "not implemented yet" in stubs.stdout
    assert "Total: 0/" in stubs.stdout

    submission = tmp_path / "mine"
    submission.mkdir()
    for f in (paths.KIT / "solutions").glob("lab*.py"):
        shutil.copyfile(f, submission / f.name)
    solved = subprocess.run([sys.executable, "-m", "grader.cli", "check", str(submission)],
                            cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=RUN_TIMEOUT_S)
    assert solved.returncode == 0, solved.stdout + solved.stderr
    public_points = sum(t["points"] for spec in _raw_rubric()["labs"].values()
                        for t in spec["tests"].values() if t["visibility"] == "public")
    assert f"Total: {public_points}/{public_points}" in solved.stdout
    # Lab 8's training is judged as far as a release can (no reference model), and the
    # student is told what is left to the grading.
    assert "Your training:" in solved.stdout
    words = " ".join(w for w in solved.stdout.split() if w != "│")     # a table's wrapped cells
    assert "Not checked here (this release has no reference model)" in words
    assert "the grading checks it" in words

    # No mistake catalogue in a release (it is built from the solutions), so no named
    # mistake: the failure messages still say in words what differs, and the README
    # promises no more than that.
    assert not (release / "grader" / "mistakes").exists()
    buggy = make_submission("bug_softmax_dim", tmp_path / "buggy")
    wrong = subprocess.run([sys.executable, "-m", "grader.cli", "check", str(buggy),
                            "--lab", "lab1_attention"], cwd=tmp_path,
                           env={**env, "COLUMNS": "2000"},      # one table row per line
                           capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert "sum to 1 along seq_q instead of seq_k" in " ".join(wrong.stdout.split())
    readme = (release / "README.md").read_text()
    assert "a likely cause" not in readme and "cannot, since naming" in " ".join(readme.split())


def test_release_pyproject_builds_a_package_with_the_public_suites(release, tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"),
                            str(release)], cwd=tmp_path, capture_output=True, text=True,
                           timeout=RUN_TIMEOUT_S)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "grader/suites/public/test_lab1_attention.py" in names
    assert "grader/suites/pytest.ini" in names and "grader/suites/_inputs.py" in names
    assert not [n for n in names if "/hidden/" in n]
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "grader = grader.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


# ======================================================================================
# grader gradescope + run_autograder
# ======================================================================================


@pytest.fixture(scope="module")
def autograder_zip(tmp_path_factory) -> Path:
    return build_gradescope(tmp_path_factory.mktemp("gradescope") / "autograder.zip", Course(paths.KIT))


@pytest.fixture(scope="module")
def schema_validator():
    schema = json.loads(SCHEMA.read_text())
    try:
        import jsonschema
    except ModuleNotFoundError:
        return None
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def check_results(payload: dict, validator) -> None:
    """results.json follows Gradescope's specification and our own stricter expectations."""
    if validator is not None:
        errors = sorted(validator.iter_errors(payload), key=str)
        assert not errors, "\n".join(e.message for e in errors)
    assert isinstance(payload["score"], (int, float))
    assert payload["stdout_visibility"] == "hidden"
    for t in payload["tests"]:
        assert {"name", "score", "max_score", "status", "visibility", "output"} <= set(t)
        assert t["status"] in ("passed", "failed")
        assert t["score"] == (t["max_score"] if t["status"] == "passed" else 0)
        assert t["visibility"] in ("visible", "after_published")
    assert payload["score"] == pytest.approx(sum(t["score"] for t in payload["tests"]))
    strings = [payload["output"]] + [t["output"] for t in payload["tests"]]
    for text in strings:
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f\ud800-\udfff]", text), text


def run_autograder(zip_path: Path, root: Path, submission: Path | None, *,
                   env: dict | None = None, timeout: float = RUN_TIMEOUT_S):
    """Unpack ``zip_path`` into ``root/autograder`` as Gradescope does and run it there."""
    autograder = root / "autograder"
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(autograder / "source")
    for name in ("run_autograder", "setup.sh"):
        os.chmod(autograder / "source" / name, 0o755)
    shutil.copyfile(autograder / "source" / "run_autograder", autograder / "run_autograder")
    os.chmod(autograder / "run_autograder", 0o755)
    if submission is not None:
        shutil.copytree(submission, autograder / "submission")
    else:
        (autograder / "submission").mkdir()
    (autograder / "results").mkdir()
    (root / "tmp").mkdir()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GRADER_"))}
    full_env.update(AUTOGRADER_ROOT=str(autograder), AUTOGRADER_PYTHON=sys.executable,
                    TMPDIR=str(root / "tmp"))
    full_env.update(env or {})
    started = time.monotonic()
    proc = subprocess.run([str(autograder / "run_autograder")], cwd=autograder, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    elapsed = time.monotonic() - started
    raw = (autograder / "results" / "results.json").read_bytes()
    raw.decode("ascii")  # every non-ASCII character is escaped
    return json.loads(raw), proc, elapsed


def test_zip_has_gradescope_entry_points_and_the_whole_grader(autograder_zip):
    with zipfile.ZipFile(autograder_zip) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        for script in ("setup.sh", "run_autograder"):
            assert script in infos, script                         # at the zip's root
            assert stat.S_IMODE(infos[script].external_attr >> 16) == 0o755
            assert zf.read(script).startswith(b"#!/usr/bin/env bash\n")
        # The course secret travels with the autograder: its hidden inputs are the course's.
        assert zf.read(SECRET_FILE).decode().strip() == course_secret(paths.KIT).hex()
        for needed in ("rubric.yaml", "requirements.txt", "pyproject.toml", "autograder.json",
                       "grader/grading.py", "grader/autograder/gradescope.py",
                       "grader/suites/pytest.ini"):
            assert needed in infos, needed
        for f in (paths.SUITES / "hidden").glob("*.py"):
            assert f"grader/suites/hidden/{f.name}" in infos
        for f in (paths.KIT / "solutions").glob("lab*.py"):
            assert f"solutions/{f.name}" in infos
        assert not [n for n in infos if "__pycache__" in n or n.endswith(".pyc")]
        assert "torch" in zf.read("requirements.txt").decode()
    for script in ("setup.sh", "run_autograder"):
        source = zipfile.ZipFile(autograder_zip).read(script).decode()
        check = subprocess.run(["bash", "-n"], input=source, capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_zip_is_reproducible(autograder_zip, tmp_path):
    again = build_gradescope(tmp_path / "again.zip", Course(paths.KIT))
    assert again.read_bytes() == autograder_zip.read_bytes()


def test_gradescope_options_are_checked(tmp_path):
    with pytest.raises(BundleError, match="unknown lab"):
        build_gradescope(tmp_path / "a.zip", Course(paths.KIT), labs=["lab9_nope"])
    with pytest.raises(BundleError, match=r"\.zip"):
        build_gradescope(tmp_path / "a.tar", Course(paths.KIT))
    with pytest.raises(BundleError, match="URL"):
        build_gradescope(tmp_path / "a.zip", Course(paths.KIT), torch_index_url="not a url; rm -rf /")
    assert not list(tmp_path.iterdir())


def test_correct_submission_gets_full_marks(autograder_zip, tmp_path, schema_validator):
    submission = make_submission("ok_einsum", tmp_path / "upload")
    results, proc, _ = run_autograder(autograder_zip, tmp_path, submission)
    check_results(results, schema_validator)
    rubric = load_rubric((paths.KIT / "rubric.yaml"))
    assert len(results["tests"]) == sum(len(lab.tests) for lab in rubric.labs.values())
    assert results["score"] == rubric_points(rubric) > 0
    assert all(t["status"] == "passed" for t in results["tests"]), proc.stdout
    hidden = {f"{lab}: {n}" for lab, names in _tests_by_visibility("hidden").items()
              for n in names}
    for t in results["tests"]:
        assert t["visibility"] == ("after_published" if t["name"] in hidden else "visible")
    assert results["extra_data"]["status"] == "ok"
    assert proc.returncode == 0


def rubric_points(rubric, labs=None) -> float:
    return sum(t.points for name in (labs or rubric.labs)
               for t in rubric.labs[name].tests.values())


def test_one_bug_loses_some_points_with_feedback(autograder_zip, tmp_path, schema_validator):
    submission = make_submission("bug_softmax_dim", tmp_path / "upload")
    results, proc, _ = run_autograder(autograder_zip, tmp_path, submission,
                                      env={"AUTOGRADER_LABS": "lab1_attention"})
    check_results(results, schema_validator)
    assert {t["name"].split(":")[0] for t in results["tests"]} == {"lab1_attention"}
    failed = [t for t in results["tests"] if t["status"] == "failed"]
    passed = [t for t in results["tests"] if t["status"] == "passed"]
    assert failed and passed, proc.stdout
    assert 0 < results["score"] < rubric_points(load_rubric((paths.KIT / "rubric.yaml")), ["lab1_attention"])
    assert all(t["output"].strip() for t in failed)


def test_broken_submission_scores_zero_and_says_why(autograder_zip, tmp_path, schema_validator):
    submission = make_submission("broken_syntax", tmp_path / "upload")
    results, _, _ = run_autograder(autograder_zip, tmp_path, submission,
                                   env={"AUTOGRADER_LABS": "lab1_attention"})
    check_results(results, schema_validator)
    assert results["score"] == 0 and results["tests"]
    assert results["extra_data"]["labs"]["lab1_attention"]["status"] == "import_error"
    assert all("SyntaxError" in t["output"] for t in results["tests"])


HOSTILE = r'''
import os, sys

NOISE = '"}]}, {"score": 999}\n\x00\x07\x1b[2J\x1b]0;pwned\x07\r\x85\u2028 </failure> ]]> & \udcff'

print(NOISE)
sys.stderr.write(NOISE.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
os.write(1, b'\xff\xfe not utf-8 "}\n')
for target in (RESULTS, "/autograder/results/results.json"):
    try:
        with open(target, "w") as fh:
            fh.write('{"score": 999, "tests": []}')
    except OSError:
        pass


def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0, training=False):
    print(NOISE * 50)
    raise RuntimeError(f"JSON-BREAKER uid={os.getuid()} " + NOISE)


def causal_mask(seq_q, seq_k=None, device=None):
    raise ValueError(NOISE * 100)
'''


def test_hostile_output_cannot_break_or_replace_results_json(autograder_zip, tmp_path,
                                                             schema_validator):
    upload = tmp_path / "upload"
    upload.mkdir()
    results_path = tmp_path / "autograder" / "results" / "results.json"
    (upload / "lab1_attention.py").write_text(f"RESULTS = {str(results_path)!r}\n" + HOSTILE,
                                              encoding="utf-8", errors="surrogatepass")
    results, proc, _ = run_autograder(autograder_zip, tmp_path, upload,
                                      env={"AUTOGRADER_LABS": "lab1_attention"})
    check_results(results, schema_validator)
    assert results["score"] == 0
    assert len(results["tests"]) == len(_tests_by_visibility("public")["lab1_attention"]
                                        | _tests_by_visibility("hidden")["lab1_attention"])
    outputs = "\n".join(t["output"] for t in results["tests"])
    assert "JSON-BREAKER" in outputs, outputs           # the student's message is shown ...
    assert '"}]}, {"score": 999}' in outputs            # ... as text, escaped in the JSON
    # Student code ran as an unprivileged user in the sandbox (root mode when we are root).
    uids = {int(u) for u in re.findall(r"uid=(\d+)", outputs)}
    assert uids and 0 not in uids


HANGS_IN_LAB2 = '''

def _spin(self, *args, **kwargs):
    while True:
        pass


MultiHeadAttention.forward = _spin
'''


def test_watchdog_writes_partial_results_before_the_timeout(autograder_zip, tmp_path,
                                                            schema_validator):
    upload = make_submission("ok_einsum", tmp_path / "upload")
    lab2 = ((paths.KIT / "solutions") / "lab2_multihead.py").read_text()
    (upload / "lab2_multihead.py").write_text(lab2 + HANGS_IN_LAB2)
    timeout_s = 40  # the runner keeps a 15 s margin: it stops itself after 25 s
    results, proc, elapsed = run_autograder(
        autograder_zip, tmp_path, upload,
        env={"AUTOGRADER_LABS": "lab1_attention,lab2_multihead",
             "AUTOGRADER_TIMEOUT_S": str(timeout_s)})
    check_results(results, schema_validator)
    assert elapsed < timeout_s, proc.stdout
    assert "watchdog" in proc.stdout
    lab1 = [t for t in results["tests"] if t["name"].startswith("lab1_attention:")]
    lab2 = [t for t in results["tests"] if t["name"].startswith("lab2_multihead:")]
    assert lab1 and all(t["status"] == "passed" for t in lab1), proc.stdout
    assert lab2 and all(t["status"] == "failed" for t in lab2)
    assert all("stopped after 25 s" in t["output"] for t in lab2)
    assert results["score"] == rubric_points(load_rubric((paths.KIT / "rubric.yaml")), ["lab1_attention"])
    assert results["extra_data"]["status"] == "timed out"


def test_results_json_is_written_even_if_python_cannot_start(autograder_zip, tmp_path,
                                                             schema_validator):
    results, proc, _ = run_autograder(autograder_zip, tmp_path, None,
                                      env={"AUTOGRADER_PYTHON": str(tmp_path / "no-python")})
    check_results(results, schema_validator)
    assert results["score"] == 0 and results["tests"] == []
    assert "could not start" in results["output"]
    assert proc.returncode != 0


def test_misconfiguration_still_leaves_a_valid_results_json(autograder_zip, tmp_path,
                                                            schema_validator):
    results, proc, _ = run_autograder(autograder_zip, tmp_path, None,
                                      env={"AUTOGRADER_LABS": "lab9_nope"})
    check_results(results, schema_validator)
    assert results["score"] == 0 and "misconfigured" in results["output"]
    assert "lab9_nope" in proc.stdout


def test_sandbox_preflight_names_what_a_worker_can_see(rubric, zygote, tmp_path):
    from grader.grading import Grader

    with Grader(Course(paths.KIT, rubric), zygote=zygote) as grader:
        assert grader.isolation_problem([(paths.KIT / "solutions"), (paths.KIT / "rubric.yaml"), tmp_path]) is None
        # /usr is bound read-only into every worker: the probe must notice it.
        assert grader.isolation_problem([Path("/usr")]) == "sandbox workers can see /usr"


def test_the_release_computes_no_answer(release):
    """Public tests compare with values stored at release time: the release's _inputs.py has
    the references' names and no code behind them (no lab 1 attention, no sinusoid)."""
    inputs = (release / "grader" / "suites" / "_inputs.py").read_text()
    for answer in ("attention_weights64", "attention_output64", "sinusoidal64(seq_len",
                   "masked_fill", "torch.sin", "MultiheadAttention", "TransformerEncoderLayer"):
        assert answer not in inputs, answer
    assert "_snapshot.lookup('attention_reference'" in inputs
    stored = json.loads((release / "grader" / "suites" / "_expected.json").read_text())
    assert stored and all(set(v) & {"data", "tuple", "list"} for v in stored.values())


def test_a_reference_function_under_another_name_stops_the_release(tmp_path):
    """The scan knows the references by their code, not their names or lines."""
    course, package = tmp_path / "course", tmp_path / "package"
    shutil.copytree(paths.KIT, course, ignore=shutil.ignore_patterns(
        ".venv", ".git", "__pycache__", "graded", "*.egg-info"))
    shutil.copytree(paths.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    source = (package / "suites" / "_inputs.py").read_text()
    start = source.index("def attention_weights64(")
    body = source[start:source.index("\n\n\n", start)]
    smuggled = body.replace("def attention_weights64(", "def handy_softmax(")
    public = package / "suites" / "public" / "test_lab1_attention.py"
    public.write_text(public.read_text() + "\n\n" + smuggled + "\n")
    with pytest.raises(BundleError, match="reference code \\(attention_weights64"):
        build_release(tmp_path / "out", Course(course, course / "rubric.yaml"),
                      package=package)


def test_release_words_are_written_for_a_student(release, tmp_path):
    """The kit speaks to a student (#29): the README's example summary line is one a check
    can print (its lab's real public count), it documents `grader feedback` and how a
    notebook class gets its notebooks; the contract has no instructor notes and points to
    no file the kit lacks; no stub opens with "Generated from solutions/..."; a check's
    table keeps whole test names in a log (no terminal); `grader notebooks` says in one
    line that it is not in a kit."""
    from grader.outputs.text import short_name
    readme = (release / "README.md").read_text()
    public = load_rubric(release / "rubric.yaml")
    examples = re.findall(r"`((lab\d+): (\d+)/(\d+) public tests pass)`", readme)
    assert examples, readme
    for line, short, passed, total in examples:
        lab = next(name for name in public.labs if short_name(name) == short)
        n = sum(t.visibility == "public" for t in public.labs[lab].tests.values())
        assert int(total) == n and int(passed) <= n, (line, n)
    assert "grader feedback" in readme and "feedback.html" in readme
    assert "nbgrader" in readme and ".ipynb" in readme
    contract = (release / "docs" / "LAB_CONTRACT.md").read_text()
    for instructor_only in ("solutions/", "docs/security.md", "as implemented and graded",
                            "The project's"):
        assert instructor_only not in contract, instructor_only
    full = (paths.KIT / "docs" / "LAB_CONTRACT.md").read_text()
    assert re.findall(r"^## .*", contract, re.M) == re.findall(r"^## .*", full, re.M)
    for stub in (release / "exercises").glob("lab*.py"):
        first = stub.read_text().splitlines()[0]
        assert "Generated from" not in first and "solutions/" not in first, (stub.name, first)
    env = {k: v for k, v in _bundle_env(release).items() if k not in ("COLUMNS", "LINES")}
    buggy = make_submission("bug_softmax_dim", tmp_path / "buggy")
    proc = subprocess.run([sys.executable, "-m", "grader.cli", "check", str(buggy),
                           "--lab", "lab1_attention"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    names = [n for n, t in public.labs["lab1_attention"].tests.items() if t.visibility == "public"]
    for name in names:
        assert name in proc.stdout, (name, proc.stdout)
    proc = subprocess.run([sys.executable, "-m", "grader.cli", "notebooks", "--out",
                           str(tmp_path / "nb")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    said = (proc.stdout + proc.stderr).strip()
    assert proc.returncode != 0 and "Traceback" not in said and len(said.splitlines()) == 1, said
    assert "instructor" in said, said
