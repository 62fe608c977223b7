"""The students of a batch: one entry of ROOT each (a folder of lab files, or a .zip of one)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from grader.outputs.gradebook import GRADEBOOK_FILES


@dataclass(frozen=True)
class Entry:
    """One student's submission in ROOT."""
    student: str
    path: Path
    kind: str                    # folder | zip | other
    problem: str = ""            # why it cannot be graded at all ("" when it can)


def list_students(root: Path, *, out: Path | None = None) -> list[Entry]:
    """The students of ROOT, sorted by id; skips hidden entries and the output folder."""
    root = Path(root)
    by_id: dict[str, list[Entry]] = {}
    for path in sorted(root.iterdir(), key=lambda p: p.name):
        name = path.name
        if name.startswith(".") or (out is not None and _same_path(path, out)):
            continue
        if path.is_symlink():
            entry = Entry(name, path, "other", f"{name} is a symbolic link; put the "
                                               "submission itself in the folder")
        elif path.is_dir():
            entry = Entry(name, path, "folder")
        elif path.is_file() and name.lower().endswith(".zip"):
            entry = Entry(name[:-4], path, "zip")
        else:
            entry = Entry(name, path, "other", f"{name} is not a folder or a .zip file")
        by_id.setdefault(entry.student, []).append(entry)
    entries = []
    for student, found in sorted(by_id.items()):
        entry = found[0]
        if len(found) > 1:
            names = ", ".join(e.path.name for e in found)
            entry = Entry(student, entry.path, "other",
                          f"more than one submission for {student} ({names}); keep one")
        elif student in GRADEBOOK_FILES:
            entry = Entry(student, entry.path, "other",
                          f"{entry.path.name} has the name of a gradebook file; rename it")
        entries.append(entry)
    return entries


def _same_path(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
