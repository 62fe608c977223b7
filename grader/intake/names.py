"""Near-miss lab file names: ``lab1_attention (1).py`` when ``lab1_attention.py`` is expected.

A missing lab file is the commonest reason a newcomer scores 0: the browser saved a second
copy (``lab1_attention (1).py``), the editor capitalised it (``Lab2_Multihead.py``), it was
shortened (``lab3.py``) or hyphenated (``lab1-attention.py``). ``suggestion`` finds such a
file among those of a submission, so every route that reports a missing lab (check, grade,
batch, Gradescope, the notebooks) can say "did you mean ...?". Never reads a file's contents.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

LAB_SUFFIXES = (".py", ".ipynb")
MAX_LISTED = 10                 # files named in a "files found" list
FILES_FOUND = "Files found:"  # what starts the list of a submission's files in a message
CUTOFF = 0.75                   # difflib ratio of normalised names that counts as close

_COPY = re.compile(r"(\s*\(\d+\)|\s*-?\s*copy(\s*\d+)?|\s*\[\d+\])+$", re.IGNORECASE)
_SEPARATORS = re.compile(r"[\s\-.]+")
_LAB_NUMBER = re.compile(r"^lab_?(\d+)(?:_|$)")


def normalise(stem: str) -> str:
    """A file stem compared without case, copy marks ("(1)", "copy"), and with spaces,
    hyphens and dots as underscores: ``Lab1-Attention (1)`` -> ``lab1_attention``."""
    stem = _COPY.sub("", stem.strip())
    stem = _SEPARATORS.sub("_", stem.lower())
    stem = re.sub(r"_+", "_", stem).strip("_")
    return re.sub(r"^lab_(\d)", r"lab\1", stem)          # "lab_1_attention" -> "lab1_attention"


def _lab_number(stem: str) -> str | None:
    m = _LAB_NUMBER.match(stem)
    return m.group(1) if m else None


def is_close(candidate: str, expected: str) -> bool:
    """Whether file name ``candidate`` looks like a misnamed ``expected`` (a lab's file)."""
    cand, want = Path(candidate), Path(expected)
    if cand.suffix.lower() not in LAB_SUFFIXES:
        return False
    got, stem = normalise(cand.stem), normalise(want.stem)
    if got == stem:
        return True
    number, want_number = _lab_number(got), _lab_number(stem)
    if number is not None and want_number is not None:
        if number != want_number:
            return False                      # lab2_attention is not lab1_attention
        if got == f"lab{number}" or stem.startswith(got + "_") or got.startswith(stem):
            return True                       # lab3, lab2_multi, lab1_attention_final
    return difflib.SequenceMatcher(None, got, stem).ratio() >= CUTOFF


def submission_files(root: Path, depth: int) -> list[str]:
    """The files of a submission folder (relative paths, up to ``depth`` folders down; no
    hidden or ``__`` folders, links not followed), sorted."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
        if len(rel.parts) >= depth:
            dirnames[:] = []
        found.extend((rel / name).as_posix() for name in filenames if not name.startswith("."))
    return sorted(found)


def suggestion(expected: str, files: list[str], taken: set[str]) -> tuple[str, str]:
    """Texts to add to "``expected`` was not found": the close file names among ``files``
    (relative paths; those in ``taken``, other labs' own files, are not candidates), and the
    files found; ("", "") when nothing is close."""
    close = [f for f in files if Path(f).name not in taken and is_close(Path(f).name, expected)]
    if not close:
        return "", ""
    first = Path(close[0])
    want = Path(expected).stem + first.suffix.lower()
    listed = ", ".join(files[:MAX_LISTED]) + (f" and {len(files) - MAX_LISTED} more"
                                               if len(files) > MAX_LISTED else "")
    return f"; found {', '.join(close[:3])}: did you mean {want}?", f" {FILES_FOUND} {listed}"
