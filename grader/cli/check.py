"""``grader check [SUBMISSION] [--lab LAB]``: a student runs the public tests on their work.

With no SUBMISSION it checks the current folder when that holds lab files (the rubric's
``labN_*.py`` or ``.ipynb``, or a near-miss name such as ``lab1_attention (1).py``), else
the course's ``exercises/``, and says which. A single lab file checks that lab only. The
last lines are one summary per lab: ``lab1: 7/9 public tests pass``.
"""

from __future__ import annotations

from pathlib import Path

from grader.cli.common import grade_submission
from grader.outputs.text import lab_summary, short_name  # noqa: F401 - short_name: callers
from grader.errors import EXIT_FAILED, EXIT_OK


def _lab_names(rubric) -> set[str]:
    return {name for spec in rubric.labs.values()
            for name in (spec.file, Path(spec.file).stem + ".ipynb")}


def holds_lab_files(folder: Path, rubric) -> bool:
    """Whether ``folder`` (not its subfolders) has a lab file of the rubric, or a near miss."""
    from grader.intake.names import is_close

    names = _lab_names(rubric)
    try:
        files = [p.name for p in folder.iterdir() if p.is_file()]
    except OSError:
        return False
    return any(f in names or any(is_close(f, spec.file) for spec in rubric.labs.values())
               for f in files)


def labs_in_folder(folder: Path, rubric) -> list[str]:
    """The labs whose file or notebook (or a near miss of its name) ``folder`` holds, in
    the rubric's order: what a student working on some labs asks a check of."""
    from grader.intake.names import is_close

    try:
        files = [p.name for p in folder.iterdir() if p.is_file()]
    except OSError:
        return []
    notebook = {lab: Path(spec.file).stem + ".ipynb" for lab, spec in rubric.labs.items()}
    return [lab for lab, spec in rubric.labs.items()
            if any(f in (spec.file, notebook[lab]) or is_close(f, spec.file) for f in files)]


def lab_of_file(path: Path, rubric) -> str | None:
    """The lab whose file (or notebook) ``path`` is, else None."""
    for lab, spec in rubric.labs.items():
        if path.name in (spec.file, Path(spec.file).stem + ".ipynb"):
            return lab
    return None


def cmd_check(args) -> int:
    from grader.cli.common import course_arg, labs_arg
    from grader.cli.common import waited_s
    from grader.outputs.terminal import render_table

    course = course_arg(args)
    rubric = course.rubric
    labs = labs_arg(args.lab) or None
    if args.submission:
        submission = Path(args.submission)
        if labs is None and submission.is_file() and (lab := lab_of_file(submission, rubric)):
            labs = [lab]
    else:
        here = Path.cwd()
        submission = here if holds_lab_files(here, rubric) else course.exercises
    if labs is None and submission.is_dir() and submission != course.exercises:
        # The labs whose files are here: a student checks the labs they work on, not a
        # line per lab they have not started (grader grade still grades every lab).
        labs = labs_in_folder(submission, rubric) or None
    print(f"Checking {submission.resolve() if submission.exists() else submission}"
          + (f" ({', '.join(labs)})" if labs else ""), flush=True)
    result = grade_submission(submission, course=course, labs=labs, visibility=("public",))
    render_table(result, waited_s=waited_s())
    for note in result.notes:   # a file found elsewhere, re-encoded, a notebook's cells left out
        print(f"Note: {note}")
    failed = [t for lab in result.labs for t in lab.tests if not (t.passed or t.deferred)]
    deferred = [t for lab in result.labs for t in lab.tests if t.deferred]
    if failed:
        print(f"{len(failed)} public test(s) failing. The hidden tests check more cases; "
              "passing these is a start, not a guarantee.")
    if deferred:
        print(f"{len(deferred)} resource test(s) measured when your work is graded: this "
              "machine runs the portable sandbox, which cannot measure them.")
    for lab in result.labs:
        print(lab_summary(lab))
    return EXIT_FAILED if failed else EXIT_OK


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="students: run the public tests on your work")
    p.add_argument("submission", nargs="?",
                   help="a folder with your lab files, or one lab file (default: this folder "
                        "if it holds lab files, else the course's exercises/)")
    p.add_argument("--lab", action="append", metavar="LAB",
                   help="only this lab, e.g. lab1_attention (repeat, or comma-separate)")
    p.set_defaults(func=cmd_check)
