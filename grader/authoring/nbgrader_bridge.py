"""Put the grader's results into an nbgrader gradebook, through nbgrader's own API.

``grader nbgrader-export --db sqlite:///gradebook.db RESULTS...`` reads results written by
``grader grade --out DIR`` (``DIR/results.json``, Gradescope format: the student is the folder
name) or ``SubmissionResult.to_dict()`` JSON files (``grader batch``; the student is the
``submission`` field), and for each student and lab:

- makes sure the student, the assignment (the lab, e.g. ``lab1_attention``), its notebook (same
  name) and its grade cells exist: one per public test and one for all hidden tests (worth
  their points together), named like the test cells of the generated notebooks
  (grader.intake.notebook.grade_cell_for), so a gradebook made by ``nbgrader
  generate_assignment`` from ``grader notebooks`` gets the scores in its own cells;
- creates the submission if nbgrader has none, and sets every cell's score (as the auto score,
  or with ``score="manual"`` as the manual score, which formgrader shows over nbgrader's own);
- writes a summary of the failed tests (hidden ones value-free, as the grader made them) as the
  auto comment of the notebook's first solution cell, when the gradebook has one.

nbgrader is an optional dependency (``pip install 'attention-labs[notebooks]'``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grader.intake.notebook import grade_cell_for
from grader.results import LabResult, SubmissionResult, TestResult
from grader.errors import ExportError

__all__ = ["ExportError", "ExportReport", "export_results", "load_result_files", "result_from_json"]

COURSE_ID = "attention-labs"
# What a batch writes beside the results: read past without a word.
_BATCH_FILES = ("fingerprint.json", "summary.json")
_GRADESCOPE_VISIBILITY = {"visible": "public", "after_published": "hidden", "after_due_date": "hidden",
                          "hidden": "hidden"}


@dataclass
class ExportReport:
    lines: list[str] = field(default_factory=list)
    ok: bool = True
    exported: int = 0        # (student, lab) pairs written


# --------------------------------------------------------------------------------------
# Reading results
# --------------------------------------------------------------------------------------


def result_from_json(data: dict, *, default_name: str) -> SubmissionResult | None:
    """A SubmissionResult from ``to_dict()`` or Gradescope ``results.json`` data; None when
    *data* is neither (any other JSON: a package.json, a batch's summary.json...)."""
    try:
        return _result_from_json(data, default_name=default_name)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _result_from_json(data: dict, *, default_name: str) -> SubmissionResult | None:
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("labs"), list):
        result = SubmissionResult(submission=str(data.get("submission") or default_name),
                                  status=str(data.get("status", "ok")))
        for lab in data["labs"]:
            lr = LabResult(name=lab["name"], title=lab.get("title", ""), file=lab.get("file", ""),
                           status=lab.get("status", "graded"), message=lab.get("message", ""))
            for t in lab.get("tests", []):
                lr.tests.append(TestResult(
                    lab=lab["name"], name=t["name"], description=t.get("description", ""),
                    visibility=t.get("visibility", "public"), max_score=float(t["max_score"]),
                    passed=bool(t.get("passed", t.get("status") == "passed")),
                    message=t.get("message", ""), diagnosis=t.get("diagnosis", "")))
            result.labs.append(lr)
        return result
    if isinstance(data.get("tests"), list):          # Gradescope results.json
        result = SubmissionResult(submission=default_name)
        labs: dict[str, LabResult] = {}
        extra = (data.get("extra_data") or {}).get("labs") or {}
        for t in data["tests"]:
            name = str(t.get("name", ""))
            if ": " not in name:
                continue
            lab, test = name.split(": ", 1)
            lr = labs.setdefault(lab, LabResult(name=lab, title="", file="",
                                                status=(extra.get(lab) or {}).get("status", "graded")))
            score, max_score = float(t.get("score", 0)), float(t.get("max_score", 0))
            lr.tests.append(TestResult(
                lab=lab, name=test, description="",
                visibility=_GRADESCOPE_VISIBILITY.get(t.get("visibility"), "public"),
                max_score=max_score, passed=score >= max_score, message=t.get("output", "")))
        result.labs = list(labs.values())
        return result
    return None


def load_result_files(paths: list[Path], *, student: str | None = None,
                      skipped: list[str] | None = None) -> list[tuple[str, SubmissionResult]]:
    """(student id, result) for every result file in *paths* (files, or folders searched
    recursively for ``*.json``, hidden ones left out). Files that hold no result (a README,
    a .DS_Store, a summary.json) are skipped, and named in ``skipped`` when given; a
    student met twice is an ExportError."""
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files += sorted(f for f in p.rglob("*.json") if f.is_file()
                            and not any(part.startswith(".") for part in f.relative_to(p).parts))
        elif p.is_file():
            files.append(p)
        else:
            raise ExportError(f"{p}: no such file or folder")
    found: list[tuple[str, SubmissionResult]] = []
    seen: dict[str, Path] = {}
    for f in files:
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            data = None
        default = f.parent.name if f.name == "results.json" else f.stem
        result = result_from_json(data, default_name=default)
        if result is None:
            if skipped is not None and f.name not in _BATCH_FILES:
                skipped.append(str(f))
            continue
        sid = student or (f.parent.name if f.name == "results.json" else result.submission)
        if sid in seen:
            raise ExportError(f"{f}: a second result for student {sid!r} (the first: {seen[sid]})")
        seen[sid] = f
        found.append((sid, result))
    if student and len(found) > 1:
        raise ExportError(f"--student {student!r} names one student but {len(found)} result files were found")
    if not found:
        raise ExportError("no grader results found in " + ", ".join(str(p) for p in paths))
    return found


# --------------------------------------------------------------------------------------
# Writing the gradebook
# --------------------------------------------------------------------------------------


def _points(x: float) -> str:
    """Points as a summary prints them: at most 2 decimals (4.33, 12)."""
    return f"{round(float(x), 2):.2f}".rstrip("0").rstrip(".")


def _summary(lab: LabResult) -> str:
    failed = [t for t in lab.tests if not t.passed]
    head = f"attention-labs grader: {_points(lab.score)} of {_points(lab.max_score)} points"
    if lab.status != "graded" and lab.message:
        head += f"\n{lab.file or lab.name}: {lab.message}"
    lines = [head]
    for t in failed:
        name = t.name if t.visibility == "public" else "a hidden test"
        why = (t.message or "").strip().splitlines()
        lines.append(f"- {name} (0/{t.max_score:g}): {why[0] if why else 'failed'}"
                     + (f" Diagnosis: {t.diagnosis}" if t.diagnosis else ""))
    return "\n".join(lines)


def _grade_cells(lab: LabResult) -> dict[str, tuple[float, float]]:
    """grade cell name -> (points, max points) of *lab*: a public test's own cell, and the
    one cell of all hidden tests (their points together), as the generated notebooks have."""
    cells: dict[str, tuple[float, float]] = {}
    for t in lab.tests:
        name = grade_cell_for(lab.name, t.name, t.visibility)
        points, max_points = cells.get(name, (0.0, 0.0))
        cells[name] = (points + t.score, max_points + t.max_score)
    return cells


def _ensure_grade(gb, api, cell_name: str, lab: str, student: str):
    try:
        return gb.find_grade(cell_name, lab, lab, student)
    except api.MissingEntry:
        pass
    submission = gb.find_submission(lab, student)
    notebook = gb.find_notebook(lab, lab)
    cell = gb.find_grade_cell(cell_name, lab, lab)
    with gb.db.no_autoflush:
        sub_nb = next((n for n in submission.notebooks if n.notebook_id == notebook.id), None)
        if sub_nb is None:
            sub_nb = api.SubmittedNotebook(notebook=notebook, assignment=submission)
            gb.db.add(sub_nb)
        grade = api.Grade(cell_id=cell.id, notebook=sub_nb)
        gb.db.add(grade)
    gb.db.commit()
    return grade


@contextlib.contextmanager
def _alembic_on_path():
    """nbgrader creates and migrates a gradebook by running the ``alembic`` script, found on
    PATH; a grader started as ``.venv/bin/grader`` may not have its environment's bin there."""
    here = os.path.dirname(sys.executable)
    if shutil.which("alembic") or not os.path.exists(os.path.join(here, "alembic")):
        yield
        return
    old = os.environ.get("PATH")
    os.environ["PATH"] = here + os.pathsep + (old or "")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = old


def export_results(db_url: str, results: list[tuple[str, SubmissionResult]], *,
                   score: str = "auto", include_missing: bool = False,
                   course_id: str = COURSE_ID) -> ExportReport:
    """Write *results* into the gradebook at *db_url* (see the module docstring)."""
    try:
        from nbgrader import api
    except ImportError as exc:
        raise ExportError("nbgrader is not installed (pip install 'attention-labs[notebooks]'): "
                          f"{exc}") from None
    if score not in ("auto", "manual"):
        raise ExportError(f"score must be 'auto' or 'manual', not {score!r}")
    report = ExportReport()
    with _alembic_on_path(), api.Gradebook(db_url, course_id=course_id) as gb:
        for student, result in results:
            gb.update_or_create_student(student)
            for lab in result.labs:
                if lab.status == "missing" and not include_missing:
                    report.lines.append(f"{student}: {lab.name}: skipped (not in the submission)")
                    continue
                try:
                    gb.find_assignment(lab.name)
                except api.MissingEntry:
                    gb.add_assignment(lab.name)
                try:
                    gb.find_notebook(lab.name, lab.name)
                except api.MissingEntry:
                    gb.add_notebook(lab.name, lab.name)
                cells = _grade_cells(lab)
                for cell_name, (_, max_score) in cells.items():
                    try:
                        cell = gb.find_grade_cell(cell_name, lab.name, lab.name)
                    except api.MissingEntry:
                        gb.add_grade_cell(cell_name, lab.name, lab.name, max_score=max_score,
                                          cell_type="code")
                    else:
                        if abs(cell.max_score - max_score) > 1e-9:
                            report.lines.append(
                                f"{student}: {lab.name}: {cell_name} is worth {cell.max_score:g} in "
                                f"the gradebook but {max_score:g} in the rubric; set to the rubric's")
                            gb.update_or_create_grade_cell(cell_name, lab.name, lab.name,
                                                           max_score=max_score)
                try:
                    gb.find_submission(lab.name, student)
                except api.MissingEntry:
                    with gb.db.no_autoflush:      # nbgrader builds the rows before adding them
                        gb.add_submission(lab.name, student)
                for cell_name, (points, _) in cells.items():
                    grade = _ensure_grade(gb, api, cell_name, lab.name, student)
                    if score == "auto":
                        grade.auto_score = points
                    else:
                        grade.manual_score = points
                    grade.needs_manual_grade = False
                notebook = gb.find_notebook(lab.name, lab.name)
                if notebook.solution_cells:
                    first = sorted(notebook.solution_cells, key=lambda c: c.name)[0]
                    try:
                        comment = gb.find_comment(first.name, lab.name, lab.name, student)
                        comment.auto_comment = _summary(lab)
                    except api.MissingEntry:
                        pass
                gb.db.commit()
                report.exported += 1
                report.lines.append(f"{student}: {lab.name}: {_points(lab.score)}/"
                                    f"{_points(lab.max_score)} ({score} scores)")
    report.lines.append(f"exported {report.exported} lab result(s) of {len(results)} "
                        f"submission(s) to {db_url}")
    return report
