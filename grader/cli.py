"""``grader``: a thin command line over the Python API (grader.grading, grader.validate, ...).

Every command returns an exit status: 0 success, 1 the work ran but something failed (a
test, a check), 2 bad input (a named file, line and reason; never a bare traceback).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader import paths


class UsageError(Exception):
    """Bad input from the command line; the message names what and why."""


def _load_rubric(path: str | None):
    from grader.rubric import load_rubric
    return load_rubric(Path(path) if path else paths.RUBRIC)


def cmd_check(args) -> int:
    from grader.grading import grade_submission
    from grader.results import render_table

    submission = Path(args.submission or paths.EXERCISES)
    result = grade_submission(submission, rubric=_load_rubric(args.rubric),
                              labs=[args.lab] if args.lab else None, visibility=("public",))
    render_table(result)
    failed = [t for lab in result.labs for t in lab.tests if not t.passed]
    if failed:
        print(f"{len(failed)} public test(s) failing. The hidden tests check more cases; "
              "passing these is a start, not a guarantee.")
    return 1 if failed else 0


def cmd_grade(args) -> int:
    from grader.grading import grade_submission
    from grader.results import atomic_write_text, render_table, write_gradescope

    result = grade_submission(Path(args.submission), rubric=_load_rubric(args.rubric),
                              labs=[args.lab] if args.lab else None)
    out = Path(args.out)
    write_gradescope(result, out / "results.json")
    if args.format == "junit":
        from grader.reports import junit_xml
        atomic_write_text(out / "results.xml", junit_xml(result))
    if args.html:
        from grader.feedback import write_feedback_html
        write_feedback_html(result, out / "feedback.html")
    render_table(result, show_passed=not args.failures_only)
    print(f"Wrote {out / 'results.json'}" + (f" and {out / 'feedback.html'}" if args.html else ""))
    return 0


def cmd_validate(args) -> int:
    from grader.validate import validate
    report = validate(rubric_path=Path(args.rubric) if args.rubric else paths.RUBRIC)
    for line in report.lines:
        print(line)
    return 0 if report.ok else 1


def cmd_stubs(args) -> int:
    from grader.stubs import stub_drift, write_stubs
    if args.check:
        problems = stub_drift(solutions_dir=paths.SOLUTIONS, exercises_dir=paths.EXERCISES)
        for p in problems:
            print(p)
        print("stubs are in sync" if not problems else f"{len(problems)} stub problem(s)")
        return 1 if problems else 0
    for path in write_stubs(solutions_dir=paths.SOLUTIONS, exercises_dir=paths.EXERCISES):
        print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grader", description=__doc__.splitlines()[0])
    parser.add_argument("--rubric", help="rubric file (default: the course's rubric.yaml)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check", help="students: run the public tests on your work")
    p.add_argument("submission", nargs="?", help="folder with your lab files (default: exercises/)")
    p.add_argument("--lab", help="only this lab, e.g. lab1_attention")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("grade", help="grade one submission with the public and hidden tests")
    p.add_argument("submission", help="a folder of lab files (or one lab file)")
    p.add_argument("--out", required=True, help="folder for results.json")
    p.add_argument("--lab", help="only this lab")
    p.add_argument("--format", choices=["gradescope", "junit"], default="gradescope",
                   help="junit also writes results.xml")
    p.add_argument("--failures-only", action="store_true", help="list only failing tests")
    p.add_argument("--html", action="store_true",
                   help="also write feedback.html (results, named mistakes, pictures)")
    p.set_defaults(func=cmd_grade)

    p = sub.add_parser("validate", help="instructors: check solutions, stubs, rubric and suites agree")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("stubs", help="regenerate exercises/ from solutions/")
    p.add_argument("--check", action="store_true", help="only report drift, write nothing")
    p.set_defaults(func=cmd_stubs)

    # Commands that live with their feature: each module has register(subparsers), which
    # adds its parser(s) with set_defaults(func=...) returning an exit status.
    import importlib
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


COMMAND_MODULES = ["grader.batch", "grader.notebooks", "grader.bundles", "grader.feedback"]


def main(argv: list[str] | None = None) -> int:
    from grader.grading import SubmissionError
    from grader.rubric import RubricError
    from grader.stubs import StubError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (RubricError, SubmissionError, StubError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
