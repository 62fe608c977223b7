"""Bad input gets a clear result, never a crash (and never a hang).

Each case builds a submission from the reference solutions with one lab file replaced by
something that is not a usable lab file, grades it, and checks that the lab is refused with
a message naming the file and what is wrong, while the other labs keep full marks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import grade as shared_grade
from grader import paths
from grader.errors import SubmissionError

LAB1, LAB2 = "lab1_attention", "lab2_multihead"


def reference(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted((paths.KIT / "solutions").glob("lab*.py")):
        shutil.copyfile(f, dest / f.name)
    # lab2 imports lab1: keep it independent so that it can show "the rest still grades"
    standalone = Path(__file__).parent / "fixtures" / "submissions" / "ok_lab2_standalone"
    shutil.copyfile(standalone / "lab2_multihead.py", dest / "lab2_multihead.py")
    return dest


def grade(sub: Path, rubric, zygote, labs=(LAB1, LAB2)):
    return shared_grade(sub, rubric=rubric, zygote=zygote, labs=list(labs))


def lab_of(result, name):
    return next(lab for lab in result.labs if lab.name == name)


def assert_refused(result, lab: str, status: str, *needles: str) -> None:
    got = lab_of(result, lab)
    assert got.status == status, (got.status, got.message)
    assert got.score == 0 and all(not t.passed for t in got.tests)
    for needle in needles:
        assert needle in got.message, got.message
    for t in got.tests:
        assert t.message == got.message   # every test says why, in the same words


def assert_others_full(result, *except_labs: str) -> None:
    for lab in result.labs:
        if lab.name not in except_labs:
            failing = {t.name: t.message for t in lab.tests if not t.passed}
            assert not failing, (lab.name, failing)


# ------------------------------------------------------------------------------ whole submission

def test_missing_submission_is_a_clear_error(rubric, zygote, tmp_path):
    with pytest.raises(SubmissionError, match="no such file or folder"):
        grade(tmp_path / "nothing-here", rubric, zygote)


def test_missing_submission_through_the_cli_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "grader.cli", "grade",
                           str(tmp_path / "nothing-here"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no such file or folder" in proc.stderr and "Traceback" not in proc.stderr


def test_empty_submission_folder(rubric, zygote, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = grade(empty, rubric, zygote)
    for lab in (LAB1, LAB2):
        assert_refused(result, lab, "missing", "was not found", "folder is empty")
    assert result.score == 0 and result.status == "ok"


def test_submission_that_is_a_symlink_is_refused(rubric, zygote, tmp_path):
    link = tmp_path / "link"
    link.symlink_to((paths.KIT / "solutions"))
    with pytest.raises(SubmissionError, match="symbolic link"):
        grade(link, rubric, zygote)


def test_submission_that_is_a_fifo_is_refused(rubric, zygote, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(SubmissionError, match="not a file or folder"):
        grade(fifo, rubric, zygote)


# ------------------------------------------------------------------------------ one bad lab file

def _replace(sub: Path, lab: str, make) -> None:
    target = sub / f"{lab}.py"
    target.unlink()
    make(target)


CASES = {
    # Not UTF-8 and not cp1252 either (0x81 has no character there; cp1252 is read: below).
    "non_utf8": (lambda p: p.write_bytes(b"x = 1\n# caf\xe9 \x81\n"), "error",
                 ["lab1_attention.py:2", "not UTF-8", "0xe9", "save the file as UTF-8"]),
    "binary": (lambda p: p.write_bytes(b"\x7fELF\x02\x01\x01\x00" + os.urandom(2000)), "error",
               ["lab1_attention.py", "binary"]),
    "empty": (lambda p: p.write_text(""), "error", ["lab1_attention.py is empty"]),
    "whitespace": (lambda p: p.write_text("\n\n   \n"), "error", ["is empty"]),
    "huge_sparse": (lambda p: os.truncate(p.open("wb").name, 100 << 20), "error",
                    ["lab1_attention.py", "100.0 MiB", "limit"]),
    "symlink_to_solutions": (lambda p: p.symlink_to((paths.KIT / "solutions") / "lab1_attention.py"),
                             "error", ["symbolic link"]),
    "symlink_dangling": (lambda p: p.symlink_to("/nonexistent/lab1.py"), "error",
                         ["symbolic link"]),
    "fifo": (lambda p: os.mkfifo(p), "error", ["not a regular file"]),
    "directory": (lambda p: p.mkdir(), "error", ["not a regular file"]),
    "notebook_json": (lambda p: p.write_text(json.dumps(
        {"cells": [{"cell_type": "code", "source": ["x = 1"]}], "metadata": {},
         "nbformat": 4, "nbformat_minor": 5}, indent=1)), "error",
        ["Jupyter notebook", "lab1_attention.ipynb"]),
    "garbage_text": (lambda p: p.write_text("This is my essay about attention.\nIt is great!\n"),
                     "import_error", ["could not be imported", "SyntaxError",
                                      "lab1_attention.py:1"]),
    "json_not_notebook": (lambda p: p.write_text('{"answer": true, "missing": null}\n'),
                          "import_error", ["could not be imported"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_lab_file_is_reported_and_the_rest_still_grades(case, rubric, zygote, tmp_path):
    make, status, needles = CASES[case]
    sub = reference(tmp_path / "sub")
    _replace(sub, LAB1, make)
    result = grade(sub, rubric, zygote)
    assert result.status == "ok"
    assert_refused(result, LAB1, status, *needles)
    assert_others_full(result, LAB1)


def test_unreadable_file_says_so(rubric, zygote, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads any file; the sanitizer's own check is what is tested")
    sub = reference(tmp_path / "sub")
    (sub / "lab1_attention.py").chmod(0)
    result = grade(sub, rubric, zygote)
    assert_refused(result, LAB1, "error", "cannot be read")


def test_utf8_bom_is_accepted(rubric, zygote, tmp_path):
    sub = reference(tmp_path / "sub")
    data = (sub / "lab1_attention.py").read_bytes()
    (sub / "lab1_attention.py").write_bytes(b"\xef\xbb\xbf" + data)
    result = grade(sub, rubric, zygote, labs=(LAB1,))
    assert_others_full(result)


def test_symlinked_folder_is_not_followed(rubric, zygote, tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "work").symlink_to((paths.KIT / "solutions"), target_is_directory=True)
    result = grade(sub, rubric, zygote)
    assert_refused(result, LAB1, "missing", "not found", "symbolic links")


def test_only_lab_files_are_taken(rubric, zygote, tmp_path):
    """conftest.py, sitecustomize.py, .pth files and the like are never used."""
    sub = reference(tmp_path / "sub")
    canary = tmp_path / "canary"
    for name in ("conftest.py", "sitecustomize.py", "usercustomize.py", "evil.pth",
                 "numpy.py", "torch.py", "pytest.py"):
        (sub / name).write_text(f"open({str(canary)!r}, 'w').write('imported')\n")
    result = grade(sub, rubric, zygote)
    assert_others_full(result)
    assert not canary.exists()


def test_nested_lab_files_are_found_with_a_note(rubric, zygote, tmp_path):
    sub = tmp_path / "sub"
    reference(sub / "my_work" / "labs")
    result = grade(sub, rubric, zygote)
    assert_others_full(result)
    assert any("was found at my_work/labs/lab1_attention.py" in n for n in result.notes)


# --------------------------------------------------------------------------------------
# A lab file saved by a Windows editor (#40): CRLF, a UTF-8 BOM, cp1252 comments
# --------------------------------------------------------------------------------------

WINDOWS_EDITOR = Path(__file__).parent / "fixtures" / "submissions" / "ok_windows_editor"
CP1252_LINE = b"# caf\xe9 \x93quoted\x94\r\n"


def test_utf8_with_a_bom_and_crlf_is_kept_byte_for_byte():
    from grader.intake.encoding import to_utf8
    data = (WINDOWS_EDITOR / "lab2_multihead.py").read_bytes()
    assert data.startswith(b"\xef\xbb\xbf") and b"\r\n" in data
    assert to_utf8(data).data == data and to_utf8(data).note == ""


def test_cp1252_is_read_as_cp1252_and_said_so():
    from grader.intake.encoding import to_utf8
    got = to_utf8(CP1252_LINE + b"x = '\x96'\r\n")
    assert got.data.decode("utf-8") == "# caf\u00e9 \u201cquoted\u201d\r\nx = '\u2013'\r\n"
    assert "line 1" in got.note and "cp1252" in got.note
    # Declared cp1252 (or utf-8, wrongly): read as cp1252, and the declaration says utf-8
    # after it, on the same line, so every reader of the file reads the same text.
    for declared in (b"cp1252", b"windows-1252", b"utf-8"):
        got = to_utf8(b"#!/usr/bin/env python\r\n# -*- coding: " + declared + b" -*-\r\n"
                      + CP1252_LINE)
        assert got.data == ("#!/usr/bin/env python\r\n# -*- coding: utf-8 -*-\r\n"
                            "# caf\u00e9 \u201cquoted\u201d\r\n").encode("utf-8"), declared


@pytest.mark.parametrize("data,needle", [
    (b"# -*- coding: latin-1 -*-\n" + CP1252_LINE, "declares coding latin-1"),
    (b"# vim: set fileencoding=koi8-r :\n" + CP1252_LINE, "declares coding koi8-r"),
    (b"\xef\xbb\xbf" + CP1252_LINE, "after a UTF-8 byte order mark"),
    (b"x = 1\n# \x81\x8d undefined in cp1252\n", ":2: not UTF-8 text (byte 0x81)"),
])
def test_no_guess_where_the_file_says_otherwise_or_cp1252_cannot_be(data, needle):
    from grader.intake.encoding import NotUTF8, to_utf8
    with pytest.raises(NotUTF8, match="save the file as UTF-8") as exc:
        to_utf8(data)
    assert needle in str(exc.value)


def test_a_windows_editors_files_are_graded_as_the_same_code(rubric, zygote, tmp_path):
    """`grade` (the sanitizer): cp1252 + CRLF lab 1, BOM + CRLF lab 2, full marks, a note;
    a declared latin-1 file is refused with the reason (never guessed)."""
    from helpers import make_submission
    sub = make_submission("ok_windows_editor", tmp_path / "sub")
    result = grade(sub, rubric, zygote)
    assert_others_full(result)
    assert [n for n in result.notes if "cp1252" in n] == [
        n for n in result.notes if n.startswith("lab1_attention.py was not UTF-8")]
    assert len([n for n in result.notes if "cp1252" in n]) == 1
    data = (sub / "lab1_attention.py").read_bytes()
    (sub / "lab1_attention.py").write_bytes(b"# coding: latin-1\r\n" + data)
    result = grade(sub, rubric, zygote, labs=(LAB1,))
    assert_refused(result, LAB1, "error", "lab1_attention.py:", "declares coding latin-1")


@pytest.mark.slow
def test_check_of_a_windows_editors_file_and_notebook_says_what_it_read(tmp_path):
    """`grader check` of the fixture's folder, and of a notebook saved as cp1252: the same
    code, full marks, and a note the student sees."""
    from helpers import make_submission, run_cli
    sub = make_submission("ok_windows_editor", tmp_path / "sub")
    got = run_cli("check", sub, "--lab", LAB1, "--lab", LAB2, cwd=paths.KIT)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "lab1: 7/7 public tests pass" in got.stdout and "Traceback" not in got.stdout
    assert "Note: lab1_attention.py was not UTF-8 (first at line" in got.stdout
    source = (paths.KIT / "solutions" / f"{LAB1}.py").read_text(encoding="utf-8")
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [],
                     "execution_count": None,
                     "source": "# caf\u00e9 \u201cquoted\u201d\r\n" + source}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    folder = tmp_path / "nb"
    folder.mkdir()
    (folder / f"{LAB1}.ipynb").write_bytes(
        json.dumps(nb, ensure_ascii=False, indent=1).replace("\n", "\r\n").encode("cp1252"))
    got = run_cli("check", folder / f"{LAB1}.ipynb", cwd=paths.KIT)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "lab1: 7/7 public tests pass" in got.stdout
    assert "Note: lab1_attention.ipynb was not UTF-8" in got.stdout
