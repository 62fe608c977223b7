"""Grading as an ordered pipeline: sanitize, run, collect, score.

``grade_submission`` is the Python API behind ``grader check`` and ``grader grade``:

1. sanitize: copy only the rubric's lab files out of the submission (regular files, no
   links, size-capped, UTF-8) into a private scratch folder; say what was wrong otherwise;
2. run: import each lab in a sandbox worker, then run the lab's suites under pytest with
   the grading plugin (student code runs only in the workers);
3. collect + score: one ``TestResult`` per rubric test, points from the rubric only.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from grader import paths
from grader.notebook_source import read_regular_file
from grader.plugin import Outcome
from grader.results import LabResult, SubmissionResult, TestResult
from grader.rubric import Rubric, load_rubric
from grader.sandbox import Zygote, make_scratch
from grader.student import Session
from grader.suite_runner import SuiteRunner

MAX_FILE_BYTES = 1 << 20      # a lab file larger than 1 MiB is refused
SEARCH_DEPTH = 3              # lab files may sit this many folders deep (zipped folders)


class SubmissionError(Exception):
    """The submission as a whole cannot be graded (e.g. the path does not exist)."""


@dataclass
class Sanitized:
    files: dict[str, bytes] = field(default_factory=dict)     # file name -> contents
    problems: dict[str, str] = field(default_factory=dict)    # lab -> why it cannot be graded
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


def sanitize(submission: Path, rubric: Rubric, labs: list[str]) -> Sanitized:
    """Only the rubric's lab files cross into the scratch copy; everything else is ignored."""
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
    for lab in labs:
        spec = rubric.labs[lab]
        notebook = Path(spec.file).stem + ".ipynb"
        if only is not None and only not in (spec.file, notebook):
            out.problems[lab] = f"{spec.file} was not found in the submission"
            continue
        path = _find(root, spec.file) if only != notebook else None
        nb_path = _find(root, notebook) if path is None and only != spec.file else None
        if nb_path is not None:
            # No labN_x.py but a labN_x.ipynb: grade the code extracted from the notebook.
            from grader.notebook_source import NotebookError, lab_source_from_notebook
            rel = nb_path.relative_to(root)
            if nb_path.is_symlink():
                out.problems[lab] = f"{rel} is a symbolic link; submit the file itself"
                continue
            try:
                got = lab_source_from_notebook(nb_path, rel=rel, lab_file=spec.file,
                                               forbidden=spec.forbidden)
            except NotebookError as exc:
                out.problems[lab] = str(exc)
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
            out.problems[lab] = why
            continue
        rel = path.relative_to(root)
        if path.is_symlink():
            out.problems[lab] = f"{rel} is a symbolic link; submit the file itself"
            continue
        try:
            data = read_regular_file(path, MAX_FILE_BYTES)
        except ValueError as exc:
            out.problems[lab] = f"{rel} {exc}"
            continue
        except OSError as exc:
            out.problems[lab] = f"{rel} cannot be read ({exc.strerror or exc})"
            continue
        if b"\x00" in data:
            out.problems[lab] = f"{rel} is a binary file, not Python source"
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            out.problems[lab] = (f"{rel}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); "
                                 "save the file as UTF-8")
            continue
        if not data.strip():
            out.problems[lab] = f"{rel} is empty"
            continue
        if text.lstrip("\ufeff \t\r\n").startswith("{") and '"cells"' in text[:200_000]:
            # A notebook (JSON) saved under the .py name: importing it would only give a
            # confusing NameError (JSON's true/false/null are not Python).
            out.problems[lab] = (f"{rel} is a Jupyter notebook (JSON), not a Python file; "
                                 f"submit it as {notebook} or export it as a .py script")
            continue
        if rel != Path(spec.file):
            out.notes.append(f"{spec.file} was found at {rel}")
        out.files[spec.file] = data
    return out


def required_names(filename: str) -> list[str]:
    """The public top-level functions and classes of the reference solution (the contract)."""
    path = paths.SOLUTIONS / filename
    if not path.is_file():
        return []
    st = path.stat()
    # Asked for every lab of every submission: parsed once per version of the file.
    return list(_public_names(str(path), st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=32)
def _public_names(path: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    return tuple(node.name for node in tree.body
                 if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                 and not node.name.startswith("_"))


def run_suites(session: Session, rubric: Rubric, labs: list[str],
               visibility: tuple[str, ...], *,
               runner: SuiteRunner | None = None) -> tuple[list[Outcome], list[str]]:
    """Run the suites of ``labs`` under pytest in this (trusted) process.

    ``runner``: a started ``SuiteRunner`` with these labs and visibility, reused across
    submissions (a batch); without one, a runner is started for this call and closed.
    """
    if runner is not None:
        if runner.visibility != tuple(visibility):
            raise ValueError(f"the runner runs {runner.visibility} suites, not {visibility}")
        return runner.run(session, labs)
    if not labs:
        return [], []
    with _quiet_runner(rubric, labs, visibility) as own:
        return own.run(session, labs)


@contextlib.contextmanager
def _quiet_runner(rubric: Rubric, labs: list[str], visibility: tuple[str, ...]):
    """A SuiteRunner for one use, with pytest's start-up output kept off stdout."""
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), \
            SuiteRunner(rubric=rubric, labs=labs, visibility=visibility) as own:
        yield own


def score(submission_name: str, rubric: Rubric, labs: list[str], visibility: tuple[str, ...],
          outcomes: list[Outcome], lab_problems: dict[str, tuple[str, str]],
          collection_errors: list[str]) -> SubmissionResult:
    """One TestResult per rubric test; a parametrized test passes only if all cases pass."""
    by_test: dict[tuple[str, str], list[Outcome]] = {}
    for o in outcomes:
        by_test.setdefault((o.lab, o.name), []).append(o)
    result = SubmissionResult(submission=submission_name)
    for lab in labs:
        spec = rubric.labs[lab]
        status, message = lab_problems.get(lab, ("graded", ""))
        lab_result = LabResult(name=lab, title=spec.title, file=spec.file, status=status,
                               message=message)
        for name, t in spec.tests.items():
            if t.visibility not in visibility:
                continue
            cases = by_test.get((lab, name), [])
            if status != "graded":
                passed, msg, desc, dur = False, message, "", 0.0
            elif not cases:
                # A graded lab's test always runs: this is the grader's fault, never the
                # student's, and the whole result says so.
                passed, msg, desc, dur = False, "the test did not run (a grader error)", "", 0.0
                result.status = ("grader error: a suite failed to load" if collection_errors
                                 else "grader error: a test did not run")
            else:
                failed = [c for c in cases if not c.passed]
                passed = not failed
                desc = cases[0].description
                dur = sum(c.duration_s for c in cases)
                msg = ""
                if failed:
                    first = failed[0]
                    case = f"[{first.case}] " if first.case and t.visibility == "public" else ""
                    msg = case + first.message
                    if len(cases) > 1:
                        msg += f" ({len(failed)} of {len(cases)} cases failed)"
            # The first failed case's named mistake and pictures (none for hidden tests).
            diagnosis = next((c.diagnosis for c in cases if not c.passed and c.diagnosis), "")
            artifacts = [] if t.visibility != "public" else next(
                (c.artifacts for c in cases if not c.passed and c.artifacts), [])
            lab_result.tests.append(TestResult(
                lab=lab, name=name, description=desc, visibility=t.visibility,
                max_score=t.points, passed=passed, message=msg, duration_s=dur,
                diagnosis="" if passed else diagnosis, artifacts=[] if passed else artifacts))
        result.labs.append(lab_result)
    return result


def grade_submission(submission: str | Path, *, rubric: Rubric | None = None,
                     labs: list[str] | None = None,
                     visibility: tuple[str, ...] = ("public", "hidden"),
                     zygote: Zygote | None = None, name: str | None = None,
                     runner: SuiteRunner | None = None,
                     send_ahead: bool | None = None) -> SubmissionResult:
    """Grade one submission (a folder of lab files, or one lab file).

    ``zygote`` and ``runner`` (a started ``SuiteRunner``) are reused when given, as a
    batch does for every student of a grading process; otherwise started and closed here.
    ``send_ahead``: send each test's first call to its worker ahead of the test
    (grader.call_plan; recorded once per runner from the reference solutions, where they
    are present). By default only with a given ``runner``: recording costs about one
    submission's grading, which pays off over many submissions, not one.
    """
    rubric = rubric or load_rubric(paths.RUBRIC)
    labs = list(labs or rubric.labs)
    for lab in labs:
        if lab not in rubric.labs:
            raise SubmissionError(f"unknown lab {lab!r}; the labs are {', '.join(rubric.labs)}")
    if send_ahead is None:
        send_ahead = runner is not None
    with contextlib.ExitStack() as stack:
        if zygote is None:
            zygote = stack.enter_context(Zygote(forbidden=tuple(sorted(
                {f for l in rubric.labs.values() for f in l.forbidden}))))
        plan = None
        if send_ahead:
            from grader.call_plan import plan_for

            if runner is None:      # recording the plan needs a runner; grading reuses it
                runner = stack.enter_context(_quiet_runner(rubric, labs, visibility))
            plan = plan_for(runner=runner, labs=labs, zygote=zygote)
        return grade_with_session(submission, rubric=rubric, labs=labs,
                                  visibility=visibility, zygote=zygote, name=name,
                                  runner=runner, plan=plan)


def grade_with_session(submission: str | Path, *, rubric: Rubric, labs: list[str],
                       visibility: tuple[str, ...], zygote: Zygote,
                       runner: SuiteRunner | None, name: str | None = None, plan=None,
                       recording=None) -> SubmissionResult:
    """``grade_submission``'s steps with a given zygote, runner and call plan.

    ``recording``: a CallPlan filled with each test's first request (grader.call_plan
    records a plan this way).
    """
    started = time.monotonic()
    submission = Path(submission)
    if submission.suffix.lower() == ".zip" and submission.is_file() and not submission.is_symlink():
        from grader.batch import ZipRejected, unpack_zip  # the same safe unpacking as batch

        with tempfile.TemporaryDirectory(prefix="grader-zip-") as tmp:
            try:
                unpack_zip(submission, Path(tmp) / "submission")
            except ZipRejected as exc:
                raise SubmissionError(f"{submission}: {exc}") from None
            return grade_with_session(Path(tmp) / "submission", rubric=rubric, labs=labs,
                                      visibility=visibility, zygote=zygote,
                                      name=name or submission.stem, runner=runner, plan=plan,
                                      recording=recording)
    # Every lab file crosses (a lab may import another), but only ``labs`` are graded.
    clean = sanitize(submission, rubric, list(rubric.labs))
    problems = {lab: ("missing" if "not found" in why else "error", why)
                for lab, why in clean.problems.items() if lab in labs}
    scratch = make_scratch(clean.files)
    session = Session(zygote=zygote, submission_dir=scratch.name,
                      forbidden={lab: spec.forbidden for lab, spec in rubric.labs.items()},
                      plan=plan, recording=recording)
    try:
        runnable = []
        for lab in labs:
            if lab in problems:
                continue
            session.start_test(rubric.labs[lab].time_limit_s)
            error = session.probe(lab, names=required_names(rubric.labs[lab].file))
            if error is not None:
                problems[lab] = ("import_error", error.describe(hidden=False))
            else:
                runnable.append(lab)
        outcomes, collection_errors = run_suites(session, rubric, runnable, visibility,
                                                 runner=runner)
    finally:
        session.close()
        scratch.cleanup()
    result = score(name or submission.name, rubric, labs, visibility, outcomes, problems,
                   collection_errors)
    result.notes.extend(clean.notes)
    result.execution_time = time.monotonic() - started
    return result
