"""``grader check [SUBMISSION] [--lab LAB]``: a student runs the public tests on their work."""

from __future__ import annotations

from pathlib import Path

from grader import paths
from grader.cli.common import load_rubric_arg
from grader.errors import EXIT_FAILED, EXIT_OK
from grader.grading import grade_submission
from grader.outputs.terminal import render_table


def cmd_check(args) -> int:
    submission = Path(args.submission or paths.EXERCISES)
    result = grade_submission(submission, rubric=load_rubric_arg(args),
                              labs=[args.lab] if args.lab else None, visibility=("public",))
    render_table(result)
    failed = [t for lab in result.labs for t in lab.tests if not t.passed]
    if failed:
        print(f"{len(failed)} public test(s) failing. The hidden tests check more cases; "
              "passing these is a start, not a guarantee.")
    return EXIT_FAILED if failed else EXIT_OK


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="students: run the public tests on your work")
    p.add_argument("submission", nargs="?", help="folder with your lab files (default: exercises/)")
    p.add_argument("--lab", help="only this lab, e.g. lab1_attention")
    p.set_defaults(func=cmd_check)
