"""grader batch: a small class end to end, resuming, a kill mid-run, hostile students, zips.

The class is graded once per module (``graded``); the other tests copy it or grade their
own small class, so that each asserts on a run of its own.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from helpers import grade, grading_bound_s, make_submission, unbudgeted_labs
from grader.course import Course
from grader import batch, paths
from grader.batch import grade_batch
from grader.errors import SandboxError, ZipRejected
from grader.intake.zips import check_zip, unpack_zip
from grader.batch.pool import INTERNAL_ERROR, grade_task
from grader.rubric import load_rubric
from grader.results import Fault

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STUDENTS = ["alice", "bob", "carol", "dave", "erin", "frank", "gina"]
ZIP_DOTDOT = "rejected zip: member '../evil.py' points outside the folder ('..')"
ZIP_SYMLINK = "rejected zip: member 'frank/lab1_attention.py' is a symbolic link"


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def zip_folder(folder: Path, dest: Path, prefix: str = "") -> Path:
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(folder.iterdir()):
            zf.write(f, prefix + f.name)
    return dest


def class_labs(rubric) -> list[str]:
    """The labs the module's class is graded on (``grader batch --lab``): those whose tests
    have no budget (no measured calls, no training: ~2 s a student instead of ~20). What
    these tests check, the batch's bookkeeping, is the same for every lab; bench_batch and
    tests/test_benchmarks.py grade whole classes on all eight."""
    return unbudgeted_labs(rubric)


def class_points(rubric) -> float:
    return sum(rubric.labs[lab].max_points for lab in class_labs(rubric))


def last_lab(rubric) -> str:
    """A lab of the class's that no other lab of it imports (the last one), so deleting it
    breaks only itself."""
    return class_labs(rubric)[-1]


def build_class(root: Path, rubric) -> Path:
    """correct, one bug, syntax error, missing lab, two hostile zips, a correct zip."""
    make_submission("ok_einsum", root / "alice")
    make_submission("bug_no_scale", root / "bob")
    make_submission("broken_syntax", root / "carol")
    make_submission("ok_einsum", root / "dave")
    (root / "dave" / rubric.labs[last_lab(rubric)].file).unlink()
    with zipfile.ZipFile(root / "erin.zip", "w") as zf:
        zf.writestr("erin/lab1_attention.py", "x = 1\n")
        zf.writestr("../evil.py", "print('escaped')\n")
    with zipfile.ZipFile(root / "frank.zip", "w") as zf:
        info = zipfile.ZipInfo("frank/lab1_attention.py")
        info.create_system = 3
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")
    gina = make_submission("ok_einsum", root.parent / f"{root.name}-gina")
    zip_folder(gina, root / "gina.zip", prefix="gina/")
    (root / ".git").mkdir()                       # hidden entries are not students
    (root / ".git" / "lab1_attention.py").write_text("x = 1\n")
    return root


def unhurried_rubric(dest: Path) -> Path:
    """A copy of the course rubric whose long wall limits (above the ordinary 10 s: lab 8's
    trainings, 160 s for a 40 CPU s budget, and the measured resource tests) are ten times
    longer. These tests check the batch's bookkeeping against a known class; on a loaded
    machine a training ran past 160 s of wall time, and alice lost lab 8's points. The
    budgets (CPU seconds, memory) are unchanged."""
    text = (paths.KIT / "rubric.yaml").read_text(encoding="utf-8")

    def lengthen(match: re.Match) -> str:
        seconds = float(match.group(1))
        return f"time_limit_s: {seconds * 10:g}" if seconds > 10 else match.group(0)

    dest.write_text(re.sub(r"time_limit_s: *([0-9.]+)", lengthen, text), encoding="utf-8")
    return dest


@pytest.fixture(scope="module")
def batch_rubric(tmp_path_factory) -> Path:
    return unhurried_rubric(tmp_path_factory.mktemp("rubric") / "rubric.yaml")


@pytest.fixture(scope="module")
def graded(tmp_path_factory, rubric, batch_rubric):
    root = build_class(tmp_path_factory.mktemp("class"), rubric)
    out = tmp_path_factory.mktemp("out")
    summary = grade_batch(root, out=out, jobs=2, progress=False,
                          course=Course(paths.KIT, batch_rubric), labs=class_labs(rubric))
    return root, out, summary


def mtimes(out: Path) -> dict[str, int]:
    return {s: (out / s / "results.json").stat().st_mtime_ns for s in STUDENTS}


# ------------------------------------------------------------------------- end to end

def test_grades_csv_rows(graded, rubric, batch_rubric, zygote, tmp_path):
    root, out, summary = graded
    rows = read_csv(out / "grades.csv")
    labs = class_labs(rubric)
    with open(out / "grades.csv", encoding="utf-8") as fh:
        # text cells quoted (grader.outputs.spreadsheet: safe to open in a spreadsheet)
        assert fh.readline().strip() == ",".join(f'"{c}"' for c in
                                                 ["student", *labs, "total", "max_total", "status"])
    assert [r["student"] for r in rows] == STUDENTS
    full = {lab: f"{rubric.labs[lab].max_points:g}" for lab in labs}
    by = {r["student"]: r for r in rows}
    for r in rows:
        assert float(r["max_total"]) == class_points(rubric)
        assert float(r["total"]) == pytest.approx(sum(float(r[lab]) for lab in labs))
    for student in ("alice", "gina"):            # correct (a folder, and a zip of one)
        assert {lab: by[student][lab] for lab in labs} == full
        assert by[student]["status"] == "ok"
    # One bug: exactly the engine's own result for that submission.
    expected = grade(make_submission("bug_no_scale", tmp_path / "bob"),
                     rubric=load_rubric(batch_rubric), zygote=zygote, labs=labs)
    assert {lab: float(by["bob"][lab]) for lab in labs} == \
        {lab.name: lab.score for lab in expected.labs}
    assert float(by["bob"]["lab1_attention"]) < rubric.labs["lab1_attention"].max_points
    assert by["bob"]["status"] == "ok"
    # A syntax error in lab1 costs lab1, nothing else (lab2 imports lab1: graded, it gets
    # the course's lab1).
    assert by["carol"]["lab1_attention"] == "0"
    assert all(by["carol"][lab] == full[lab] for lab in labs[1:])
    # The status column says what happened (not "ok": a lab did not import).
    assert by["carol"]["status"] == "lab1_attention: import_error"
    # A missing lab is graded as zero for that lab only.
    missing = last_lab(rubric)
    assert by["dave"][missing] == "0"
    assert all(by["dave"][lab] == full[lab] for lab in labs if lab != missing)
    assert by["dave"]["status"] == f"{missing}: missing"
    # Hostile zips are refused, with the reason as the status.
    assert by["erin"]["status"] == ZIP_DOTDOT
    assert by["frank"]["status"] == ZIP_SYMLINK
    for student in ("erin", "frank"):
        assert by[student]["total"] == "0"
    assert not (root.parent / "evil.py").exists() and not (out.parent / "evil.py").exists()
    assert "execution" not in (out / "grades.csv").read_text() and "time" not in rows[0]


def test_results_json_per_student(graded, rubric):
    _, out, _ = graded
    rows = {r["student"]: r for r in read_csv(out / "grades.csv")}
    for student in STUDENTS:
        data = json.loads((out / student / "results.json").read_text())
        labs = data["extra_data"].get("labs", {})
        # Every test of every lab, except that a lab not handed in is one entry (#29).
        assert len(data["tests"]) == sum(
            1 if labs.get(name, {}).get("status") == "missing" else len(rubric.labs[name].tests)
            for name in class_labs(rubric)), student
        assert data["score"] == pytest.approx(float(rows[student]["total"]))
        graded = [lab for lab, v in data["extra_data"].get("labs", {}).items()
                  if v["status"] == "graded"]
        if data["extra_data"]["status"] != "ok" or len(graded) == len(class_labs(rubric)):
            assert data["extra_data"]["status"] == rows[student]["status"]
        else:
            assert rows[student]["status"] == "; ".join(
                f"{lab}: {v['status']}" for lab, v in data["extra_data"]["labs"].items()
                if v["status"] != "graded")
        fingerprint = json.loads((out / student / "fingerprint.json").read_text())
        assert set(fingerprint) == {"submission", "rubric", "suites", "labs"}
        assert fingerprint["labs"] == class_labs(rubric)      # the lab selection
    assert "../evil.py" in json.loads((out / "erin" / "results.json").read_text())["output"]


def test_summary_json(graded, rubric):
    _, out, summary = graded
    data = json.loads((out / "summary.json").read_text())
    rows = read_csv(out / "grades.csv")
    totals = [float(r["total"]) for r in rows]
    assert data["students"] == 7 and data["graded_ok"] == 5 and data["not_ok"] == 2
    assert data["statuses"] == {"ok": 5, ZIP_DOTDOT: 1, ZIP_SYMLINK: 1}
    assert data["max_total"] == class_points(rubric)
    score = data["score"]
    assert score["mean"] == round(sum(totals) / 7, 2)         # summary figures: 2 decimals
    assert score["median"] == sorted(totals)[3]
    assert (score["min"], score["max"]) == (min(totals), max(totals)) == (0.0, class_points(rubric))
    assert sum(score["histogram"]["counts"]) == 7
    assert score["histogram"]["counts"][-1] == 2          # alice and gina: full marks
    assert len(score["histogram"]["bin_edges"]) == len(score["histogram"]["counts"]) + 1
    # Pass rates are over the 5 students graded "ok"; check one test by hand.
    names = [f"{lab}: {t}" for lab in class_labs(rubric) for t in rubric.labs[lab].tests]
    assert list(data["tests"]) == names
    name = "lab1_attention: test_matches_pytorch_3d"
    passed = sum(any(t["name"] == name and t["status"] == "passed"
                     for t in json.loads((out / s / "results.json").read_text())["tests"])
                 for s in ("alice", "bob", "carol", "dave", "gina"))
    assert data["tests"][name]["passed"] == passed
    assert data["tests"][name]["pass_rate"] == pytest.approx(passed / 5, abs=1e-4)
    assert data["labs"][last_lab(rubric)]["statuses"].get("missing") == 1
    # The Python API's summary agrees with the files.
    assert (summary.students, summary.graded, summary.up_to_date, summary.not_ok) == (7, 7, 0, 2)
    assert summary.internal_errors == 0
    assert json.loads(json.dumps(summary.to_dict()))["mean"] == score["mean"]


def test_plots_are_png(graded):
    _, out, summary = graded
    for name in ("score_histogram.png", "test_pass_rates.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 2000
        assert summary.files[name.removesuffix(".png")] == str(out / name)


# ------------------------------------------------------------------------- resume

def test_rerun_skips_unchanged_and_regrades_only_the_changed(graded, tmp_path, rubric,
                                                            batch_rubric):
    root0, out0, _ = graded
    root, out = tmp_path / "class", tmp_path / "out"
    shutil.copytree(root0, root, symlinks=True)
    shutil.copytree(out0, out)
    before, csv_before = mtimes(out), (out / "grades.csv").read_bytes()

    again = grade_batch(root, out=out, jobs=2, progress=False,
                        course=Course(paths.KIT, batch_rubric), labs=class_labs(rubric))
    assert (again.graded, again.up_to_date) == (0, 7)
    assert mtimes(out) == before
    assert (out / "grades.csv").read_bytes() == csv_before

    shutil.copyfile((paths.KIT / "solutions") / "lab1_attention.py", root / "bob" / "lab1_attention.py")
    changed = grade_batch(root, out=out, jobs=2, progress=False,
                          course=Course(paths.KIT, batch_rubric), labs=class_labs(rubric))
    assert (changed.graded, changed.up_to_date) == (1, 6)
    after = mtimes(out)
    assert [s for s in STUDENTS if after[s] != before[s]] == ["bob"]
    bob = next(r for r in read_csv(out / "grades.csv") if r["student"] == "bob")
    assert float(bob["total"]) == class_points(rubric)


# ------------------------------------------------------------------------- kill mid-run

def _grader_command() -> list[str]:
    script = Path(sys.executable).with_name("grader")
    return [str(script)] if script.exists() else [sys.executable, "-m", "grader.cli"]


def test_killed_batch_resumes_to_the_same_gradebook(graded, tmp_path, rubric, batch_rubric):
    root, out0, _ = graded
    out = tmp_path / "out"
    proc = subprocess.Popen([*_grader_command(), "--rubric", str(batch_rubric), "batch",
                             str(root), "--out", str(out),
                             "--jobs", "1", "--quiet", "--lab", ",".join(class_labs(rubric))],
                            start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # The two refused zips are written at once; wait for a graded student or two more
        # (as long as one grading may take: a fixed 240 s ran out at load 3-10).
        deadline = time.monotonic() + grading_bound_s(load_rubric(batch_rubric))
        while len(list(out.glob("*/fingerprint.json"))) < 3:
            assert proc.poll() is None, "the batch ended before it could be killed"
            assert time.monotonic() < deadline, "no student was graded in time"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)      # the batch, its grading processes, zygotes
        proc.wait()
    done = len(list(out.glob("*/fingerprint.json")))
    assert 3 <= done < len(STUDENTS), done
    assert not (out / "grades.csv").exists()

    resumed = grade_batch(root, out=out, jobs=2, progress=False,
                          course=Course(paths.KIT, batch_rubric), labs=class_labs(rubric))
    assert resumed.up_to_date >= 3 and resumed.graded == len(STUDENTS) - resumed.up_to_date
    assert (out / "grades.csv").read_bytes() == (out0 / "grades.csv").read_bytes()
    assert (out / "summary.json").read_bytes() == (out0 / "summary.json").read_bytes()


# ------------------------------------------------------------------------- hostile students

def quick_rubric(dest: Path, seconds: int) -> Path:
    """A copy of the course rubric whose ordinary time limits (10 s or less) are ``seconds``;
    the resource tests keep theirs (each of their calls starts a measured worker of its own)."""
    text = (paths.KIT / "rubric.yaml").read_text(encoding="utf-8")

    def shorten(match: re.Match) -> str:
        return f"time_limit_s: {seconds}" if float(match.group(1)) <= 10 else match.group(0)

    dest.write_text(re.sub(r"time_limit_s: *([0-9.]+)", shorten, text), encoding="utf-8")
    return dest


def test_hostile_students_do_not_affect_others(tmp_path, rubric):
    root = tmp_path / "class"
    make_submission("ok_einsum", root / "a_good")
    hang = make_submission("ok_einsum", root / "b_hang_import")
    hang.joinpath("lab1_attention.py").write_text("while True:\n    pass\n")
    gone = make_submission("ok_einsum", root / "c_exit_import")
    gone.joinpath("lab2_multihead.py").write_text("import os\nos._exit(3)\n")
    # The class's labs (no measured calls, no training): what is tested is that hostile
    # students cost nobody else anything.
    labs = class_labs(rubric)
    quick = Course(paths.KIT, quick_rubric(tmp_path / "rubric.yaml", 3))
    grade_batch(root, out=tmp_path / "out", jobs=2, progress=False, course=quick, labs=labs)

    by = {r["student"]: r for r in read_csv(tmp_path / "out" / "grades.csv")}
    assert list(by) == ["a_good", "b_hang_import", "c_exit_import"]
    assert float(by["a_good"]["total"]) == sum(rubric.labs[lab].max_points for lab in labs)
    assert by["a_good"]["status"] == "ok"
    # A hanging import and an os._exit at import cost their own labs and nothing else.
    assert by["b_hang_import"]["lab1_attention"] == "0"
    assert float(by["b_hang_import"]["lab2_multihead"]) == rubric.labs["lab2_multihead"].max_points
    assert by["b_hang_import"]["status"] == "lab1_attention: import_error"
    assert float(by["c_exit_import"]["lab1_attention"]) == rubric.labs["lab1_attention"].max_points
    assert by["c_exit_import"]["lab2_multihead"] == "0"
    assert by["c_exit_import"]["status"] == "lab2_multihead: import_error"
    for student in ("b_hang_import", "c_exit_import"):
        assert all(float(by[student][lab]) == rubric.labs[lab].max_points for lab in labs[2:])


def test_a_student_past_the_batch_budget_is_stopped_and_regraded_never_scored(
        tmp_path, rubric, monkeypatch):
    """A student whose every lab 1 call hangs would time out test after test; the batch's
    own budget (here 20 s of wall time) stops it first: a grader fault, retried on the next
    run. Graded alone: a 20 s wall budget would also stop an honest student on a loaded
    machine (it did, at load 9), which is what the budget is for, and not what is tested."""
    root = tmp_path / "class"
    slow = make_submission("ok_einsum", root / "d_hang_calls")
    source = slow.joinpath("lab1_attention.py").read_text()
    slow.joinpath("lab1_attention.py").write_text(
        source + "\n\ndef scaled_dot_product_attention(*args, **kwargs):\n"
                 "    while True:\n        pass\n")
    monkeypatch.setattr(batch, "student_budget_s", lambda rubric: 20.0)
    quick = Course(paths.KIT, quick_rubric(tmp_path / "rubric.yaml", 3))
    summary = grade_batch(root, out=tmp_path / "out", jobs=1, progress=False, course=quick,
                          labs=["lab1_attention"])
    by = {r["student"]: r for r in read_csv(tmp_path / "out" / "grades.csv")}
    assert by["d_hang_calls"]["status"] == \
        "grading failed: took longer than 20 s and was stopped"
    assert not (tmp_path / "out" / "d_hang_calls" / "fingerprint.json").exists()
    assert summary.internal_errors == 1 and summary.not_ok == 1


# ------------------------------------------------------------------------- zip safety

def _zip(path: Path, members: dict[str, bytes | str]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


@pytest.mark.parametrize("members, reason", [
    ({"/etc/cron.d/x": "x"}, "member '/etc/cron.d/x' has an absolute path"),
    ({"a/../../x.py": "x"}, "member 'a/../../x.py' points outside the folder ('..')"),
    ({f"f{i}.py": "x" for i in range(201)}, "has 201 members; the limit is 200"),
    ({"big.py": b"0" * (2 * 2**20 + 1)},
     "member 'big.py' is 2.0 MB uncompressed; the limit is 2 MB"),
    ({f"f{i}.bin": b"0" * (2 * 2**20) for i in range(11)}, "more than 20 MB uncompressed in total"),
])
def test_check_zip_refuses(tmp_path, members, reason):
    with pytest.raises(ZipRejected) as exc:
        check_zip(_zip(tmp_path / "s.zip", members))
    assert str(exc.value) == reason


def test_check_zip_refuses_symlink_and_garbage(tmp_path):
    path = tmp_path / "link.zip"
    with zipfile.ZipFile(path, "w") as zf:
        info = zipfile.ZipInfo("lab1_attention.py")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/shadow")
    with pytest.raises(ZipRejected, match="is a symbolic link"):
        check_zip(path)
    (tmp_path / "junk.zip").write_bytes(b"not a zip at all")
    with pytest.raises(ZipRejected, match="not a readable zip file"):
        check_zip(tmp_path / "junk.zip")


def test_unpack_zip_keeps_folders_inside_dest(tmp_path):
    path = _zip(tmp_path / "s.zip", {"sub/": "", "sub/lab1_attention.py": "x = 1\n",
                                      "./top.py": "y = 2\n"})
    dest = tmp_path / "dest"
    dest.mkdir()
    unpack_zip(path, dest)
    assert (dest / "sub" / "lab1_attention.py").read_text() == "x = 1\n"
    assert (dest / "top.py").read_text() == "y = 2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "s.zip"]


def test_bad_root_is_a_usage_error(tmp_path):
    from grader.cli import main
    from grader.errors import UsageError
    with pytest.raises(UsageError, match="not a folder of submissions"):
        grade_batch(tmp_path / "nope", out=tmp_path / "out", progress=False, course=Course(paths.KIT))
    assert main(["batch", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2


# ------------------------------------------------------------------------- small parts

def test_submission_digest_follows_the_graded_bytes(tmp_path):
    from grader.batch.students import Entry
    from grader.batch.fingerprints import submission_digest
    folder = make_submission("ok_einsum", tmp_path / "alice")
    entry = Entry("alice", folder, "folder")
    first = submission_digest(entry)
    (folder / ".ipynb_checkpoints").mkdir()               # hidden: not part of the work
    (folder / ".ipynb_checkpoints" / "lab1_attention.py").write_text("x = 1\n")
    assert submission_digest(entry) == first
    lab1 = folder / "lab1_attention.py"
    lab1.write_bytes(lab1.read_bytes() + b"\n")
    assert submission_digest(entry) != first
    zipped = zip_folder(folder, tmp_path / "alice.zip")
    assert submission_digest(Entry("alice", zipped, "zip")) != submission_digest(entry)


def test_fingerprint_must_match_in_full(tmp_path, rubric):
    from grader.batch.fingerprints import course_digests, is_up_to_date
    from grader.outputs.gradebook import failed_result
    from grader.outputs.gradescope import write_gradescope
    fingerprint = {"submission": "abc", **course_digests(rubric)}
    (tmp_path / "fingerprint.json").write_text(json.dumps(fingerprint))
    assert not is_up_to_date(tmp_path, fingerprint)       # no results.json yet
    write_gradescope(failed_result("s", rubric, "why", Fault.STUDENT), tmp_path / "results.json")
    assert is_up_to_date(tmp_path, fingerprint)
    assert not is_up_to_date(tmp_path, {**fingerprint, "rubric": "changed"})
    assert not is_up_to_date(tmp_path, {**fingerprint, "suites": "changed"})


def test_plain_progress_lines(capsys):
    from grader.batch.progress import Progress
    progress = Progress(total=3, enabled=True)            # stdout is not a terminal here
    for status, fault in (("ok", None), ("rejected zip: x", Fault.STUDENT), ("ok", None)):
        progress.advance({"status": status, "fault": fault})     # counted by fault, not words
    progress.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("graded 1/3  elapsed 0s  ETA ")
    assert lines[-1].startswith("graded 3/3 (1 not ok)  elapsed ") and lines[-1].endswith("ETA 0s")


def test_listing_skips_hidden_and_flags_clashes(tmp_path):
    from grader.batch.students import list_students
    for name in ("alice", "bob", ".hidden", "grades.csv"):
        (tmp_path / name).mkdir()
    (tmp_path / "bob.zip").write_bytes(b"")
    (tmp_path / "carol.ZIP").write_bytes(b"")
    (tmp_path / "out").mkdir()
    entries = {e.student: e for e in list_students(tmp_path, out=tmp_path / "out")}
    assert list(entries) == ["alice", "bob", "carol", "grades.csv"]
    assert entries["alice"].problem == "" and entries["carol"].kind == "zip"
    assert entries["bob"].problem == "more than one submission for bob (bob, bob.zip); keep one"
    assert entries["grades.csv"].problem == "grades.csv has the name of a gradebook file; rename it"


class _FaultyGrader:
    """A Grader whose sandbox fails (a grader fault, not the student's doing)."""
    sandbox_pid = None

    def grade(self, submission, **kwargs):
        raise SandboxError("the sandbox zygote stopped during grading")


def test_a_grader_fault_is_recorded_for_regrading_never_scored(rubric, tmp_path):
    sub = make_submission("ok_einsum", tmp_path / "ada")
    task = {"student": "ada", "path": str(sub), "kind": "folder",
            "fingerprint": {"submission": "x", "rubric": "y", "suites": "z"}}
    reply = grade_task(task, rubric=rubric, out=tmp_path / "out", grader=_FaultyGrader())
    assert reply["restart"] is True                 # a fresh Grader, and the student again
    assert reply["status"].startswith(INTERNAL_ERROR) and reply["fault"] == Fault.GRADER
    assert "SandboxError: the sandbox zygote stopped" in reply["status"]
    data = json.loads((tmp_path / "out" / "ada" / "results.json").read_text())
    assert data["extra_data"]["status"] == reply["status"]
    assert data["extra_data"]["fault"] == "grader"
    assert not (tmp_path / "out" / "ada" / "fingerprint.json").exists()   # regraded next run


def _eocd(entries: int, dir_size: int, dir_offset: int = 0) -> bytes:
    return struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, min(entries, 0xFFFF),
                       min(entries, 0xFFFF), dir_size, dir_offset, 0)


@pytest.mark.parametrize("make, reason", [
    (lambda p: p.write_bytes(b"\0" * 100 + _eocd(60_000, 40 * 60_000)),
     "has 60000 members; the limit is 200"),
    (lambda p: p.write_bytes(b"\0" * 100 + struct.pack(
        "<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 1_000_000, 1_000_000, 46_000_000, 0)
        + struct.pack("<4sLQL", b"PK\x06\x07", 0, 100, 1)
        + _eocd(0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)),
     "has 1000000 members; the limit is 200"),
    (lambda p: (p.write_bytes(b""), os.truncate(p, 50 << 20)),
     "is 50.0 MB; the limit is 24 MB"),
    (lambda p: p.write_bytes(b"PK\x03\x04 no end record"),
     "not a readable zip file (no end of central directory)"),
], ids=["many_members", "zip64_million", "fifty_mb", "no_end_record"])
def test_a_zip_is_measured_from_its_end_record_before_it_is_parsed(make, reason, tmp_path,
                                                                    monkeypatch):
    path = tmp_path / "s.zip"
    make(path)

    def never(*a, **k):
        raise AssertionError("zipfile parsed a zip that its end record already refuses")

    monkeypatch.setattr("grader.intake.zips.zipfile.ZipFile", never)
    with pytest.raises(ZipRejected) as exc:
        check_zip(path)
    assert str(exc.value) == reason


# ------------------------------------------------------------------ similarity (#30)

def test_the_batch_writes_a_similarity_report_for_the_instructor_only(graded):
    """alice, dave and gina hand in the same ok_einsum code: flagged pairs in similarity.json,
    .csv and class.html; no student's own files mention any of it."""
    root, out, summary = graded
    report = json.loads((out / "similarity.json").read_text())
    assert "changes no grade" in report["note"]
    lab1 = report["labs"]["lab1_attention"]
    flagged = {frozenset((p["a"], p["b"])) for p in lab1["pairs"] if p["flagged"]}
    assert frozenset(("alice", "dave")) in flagged and frozenset(("alice", "gina")) in flagged
    # bob's and carol's lab 1 are the reference's (their fixtures change other code): close to
    # each other and to the course's solutions; alice's einsum version is not.
    assert frozenset(("bob", "carol")) in flagged and frozenset(("alice", "bob")) not in flagged
    close = {r["student"] for r in lab1["against"] if r["flagged"]}
    assert {"bob", "carol"} <= close and "alice" not in close
    assert summary.files["similarity_csv"].endswith("similarity.csv")
    assert '"alice","dave"' in (out / "similarity.csv").read_text()
    page = (out / "class.html").read_text()
    assert 'id="similarity"' in page and "changes no grade" in page
    for student in STUDENTS:
        for f in (out / student).rglob("*"):
            if f.is_file():
                text = f.read_text(errors="replace").lower()
                assert "similar" not in text and "shared code" not in text, f
