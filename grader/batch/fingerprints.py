"""Fingerprints: what a student's grade depends on, so an unchanged student is not graded again.

A fingerprint is the sha256 of the submission's bytes plus those of the rubric and the
suites; ``DIR/<student>/fingerprint.json`` is written only after the student's results.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from grader import paths
from grader.batch.students import Entry
from grader.outputs.gradebook import read_results
from grader.rubric import Rubric
from grader.secret import secret_digest


def _hash_file(h, path: Path) -> None:
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)


def submission_digest(entry: Entry) -> str:
    """sha256 of what is graded: the zip's bytes, or every file of the folder (by path)."""
    h = hashlib.sha256()
    if entry.problem:
        h.update(b"problem\0" + entry.problem.encode("utf-8", "surrogateescape"))
    elif entry.kind == "zip":
        h.update(b"zip\0")
        _hash_file(h, entry.path)
    else:
        for dirpath, dirnames, filenames in os.walk(entry.path, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
            for name in sorted(filenames):
                path = Path(dirpath) / name
                rel = os.fsencode(path.relative_to(entry.path).as_posix())  # any name bytes
                if path.is_symlink():
                    h.update(b"link\0" + rel + b"\0" + os.fsencode(os.readlink(path)) + b"\0")
                elif path.is_file():
                    h.update(b"file\0" + rel + b"\0" + str(path.stat().st_size).encode() + b"\0")
                    with contextlib.suppress(OSError):   # unreadable: graded as such
                        _hash_file(h, path)
    return h.hexdigest()


def course_digests(rubric: Rubric, secret: bytes = b"") -> dict[str, str]:
    """sha256 of the rubric file and of the suites (every .py and pytest.ini under suites/,
    and the course secret's digest: the hidden inputs derive from it)."""
    rubric_hash = hashlib.sha256(Path(rubric.path).read_bytes()).hexdigest()
    h = hashlib.sha256()
    for path in sorted(paths.SUITES.rglob("*")):
        if path.is_file() and (path.suffix == ".py" or path.name == "pytest.ini") \
                and "__pycache__" not in path.parts:
            h.update(path.relative_to(paths.SUITES).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    if secret:
        h.update(secret_digest(secret).encode())
    return {"rubric": rubric_hash, "suites": h.hexdigest()}


def is_up_to_date(student_dir: Path, fingerprint: dict) -> bool:
    try:
        stored = json.loads((student_dir / "fingerprint.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return stored == fingerprint and read_results(student_dir / "results.json") is not None
