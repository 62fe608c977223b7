"""Intake: what a student handed in (a folder, one file, a zip, a notebook) -> clean lab sources.

``sanitize`` copies only the rubric's lab files out of a submission (regular files, no
links, size-capped, UTF-8 (a Windows editor's cp1252 re-encoded,
``grader.intake.encoding``); a ``labN_x.ipynb`` where the ``.py`` is missing gives the code
extracted from the notebook) and says, per lab, why it cannot be graded: a typed
``Problem``, never message text to search; a missing lab's message names a near-miss file
(``lab1_attention (1).py``: "did you mean lab1_attention.py?", ``grader.intake.names``).
``grader.intake.zips`` unpacks zips safely.
Runs in the trusted process and never executes what it reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from grader.errors import NotebookError, SubmissionError
from grader.intake.encoding import NotUTF8, to_utf8
from grader.intake.names import submission_files, suggestion
from grader.intake.notebook import lab_source_from_notebook, read_regular_file
from grader.results import LabStatus
from grader.rubric import Rubric

MAX_FILE_BYTES = 1 << 20      # a lab file larger than 1 MiB is refused
SEARCH_DEPTH = 3              # lab files may sit this many folders deep (zipped folders)


@dataclass(frozen=True)
class Problem:
    """Why a lab of a submission cannot be graded (always the submission's doing). ``kind``:
    ``missing`` (no file for the lab) or ``error`` (a file that cannot be used: a link,
    binary, not UTF-8, empty...); the grader adds ``import_error`` and ``forbidden_api``.
    ``reason``: the message's one-line gist, without the list of files found (a one-line
    summary shows that; default: the message's first line)."""
    kind: LabStatus
    message: str
    reason: str = ""

    def __post_init__(self) -> None:     # (a frozen dataclass: set as its constructor would)
        object.__setattr__(self, "kind", LabStatus(self.kind))
        object.__setattr__(self, "reason", self.reason or (self.message.splitlines() or [""])[0])

    def __str__(self) -> str:
        return self.message


@dataclass
class Sanitized:
    """The clean lab sources of a submission, and why any lab cannot be graded."""
    files: dict[str, bytes] = field(default_factory=dict)       # file name -> contents
    problems: dict[str, Problem] = field(default_factory=dict)  # lab -> why not
    notes: list[str] = field(default_factory=list)


def _find(root: Path, name: str) -> Path | None:
    """``root/name``, or the first ``name`` up to SEARCH_DEPTH folders down (no links)."""
    if os.path.lexists(root / name):
        return root / name
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        depth = len(Path(dirpath).relative_to(root).parts)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
        if depth >= SEARCH_DEPTH:
            dirnames[:] = []
        if name in filenames:
            return Path(dirpath) / name
    return None


def sanitize(submission: Path, rubric: Rubric, labs: list[str], *,
             solutions: Path | None = None) -> Sanitized:
    """Only the rubric's lab files cross into the scratch copy; everything else is ignored.
    ``solutions``: the course's reference solutions (a notebook's lab gets its reference's
    top-level imports); None: none."""
    out = Sanitized()
    if not os.path.lexists(submission):
        raise SubmissionError(f"{submission}: no such file or folder")
    if submission.is_symlink():
        raise SubmissionError(f"{submission}: is a symbolic link; submit the folder itself")
    if submission.is_file():
        root, only = submission.parent, submission.name
    elif submission.is_dir():
        root, only = submission, None
    else:
        raise SubmissionError(f"{submission}: not a file or folder")
    # Every lab's own file names: never offered as a misnamed copy of another lab's.
    taken = {name for spec in rubric.labs.values()
             for name in (spec.file, Path(spec.file).stem + ".ipynb")}
    listing: list[str] | None = None

    def missing(why: str, expected: str) -> Problem:
        """A missing lab's problem: ``why``, then "did you mean ...?" and the files found
        (the list in the message only: a one-line ``reason`` leaves it out)."""
        nonlocal listing
        if listing is None:
            listing = [only] if only is not None else submission_files(root, SEARCH_DEPTH)
        hint, files = suggestion(expected, listing, taken)
        return Problem(LabStatus.MISSING, why + hint + files, reason=why + hint)

    for lab in labs:
        spec = rubric.labs[lab]
        notebook = Path(spec.file).stem + ".ipynb"
        if only is not None and only not in (spec.file, notebook):
            out.problems[lab] = missing(f"{spec.file} was not found in the submission",
                                        spec.file)
            continue
        path = _find(root, spec.file) if only != notebook else None
        nb_path = _find(root, notebook) if path is None and only != spec.file else None
        if nb_path is not None:
            # No labN_x.py but a labN_x.ipynb: grade the code extracted from the notebook.
            rel = nb_path.relative_to(root)
            if nb_path.is_symlink():
                out.problems[lab] = Problem(LabStatus.ERROR, f"{rel} is a symbolic link; submit the file itself")
                continue
            try:
                got = lab_source_from_notebook(nb_path, rel=rel, lab_file=spec.file,
                                               forbidden=spec.forbidden,
                                               solutions_dir=solutions)
            except NotebookError as exc:
                out.problems[lab] = Problem(LabStatus.ERROR, str(exc))
                continue
            out.files[spec.file] = got.source.encode("utf-8")
            out.notes.extend(got.notes)
            continue
        if path is None:
            why = f"{spec.file} was not found in the submission"
            with os.scandir(root) as scan:
                entries = [] if only is not None else list(scan)
            if only is None and not entries:
                why += " (the submission folder is empty)"
            elif any(e.is_symlink() for e in entries):
                why += " (symbolic links in it are not followed)"
            else:
                out.problems[lab] = missing(why, spec.file)
                continue
            out.problems[lab] = Problem(LabStatus.MISSING, why)
            continue
        rel = path.relative_to(root)
        if path.is_symlink():
            out.problems[lab] = Problem(LabStatus.ERROR, f"{rel} is a symbolic link; submit the file itself")
            continue
        try:
            data = read_regular_file(path, MAX_FILE_BYTES)
        except ValueError as exc:
            out.problems[lab] = Problem(LabStatus.ERROR, f"{rel} {exc}")
            continue
        except OSError as exc:
            out.problems[lab] = Problem(LabStatus.ERROR, f"{rel} cannot be read ({exc.strerror or exc})")
            continue
        if b"\x00" in data:
            out.problems[lab] = Problem(LabStatus.ERROR, f"{rel} is a binary file, not Python source")
            continue
        try:
            converted = to_utf8(data)
        except NotUTF8 as exc:
            out.problems[lab] = Problem(LabStatus.ERROR, f"{rel}{exc}")
            continue
        if converted.note:      # a Windows editor's cp1252: graded as the same code
            data = converted.data
            out.notes.append(f"{rel} {converted.note}")
        text = data.decode("utf-8")
        if not data.strip():
            out.problems[lab] = Problem(LabStatus.ERROR, f"{rel} is empty")
            continue
        if text.lstrip("\ufeff \t\r\n").startswith("{") and '"cells"' in text[:200_000]:
            # A notebook (JSON) saved under the .py name: importing it would only give a
            # confusing NameError (JSON's true/false/null are not Python).
            out.problems[lab] = Problem(LabStatus.ERROR, (f"{rel} is a Jupyter notebook (JSON), not a Python file; "
                                 f"submit it as {notebook} or export it as a .py script"))
            continue
        if rel != Path(spec.file):
            out.notes.append(f"{spec.file} was found at {rel}")
        out.files[spec.file] = data
    return out
