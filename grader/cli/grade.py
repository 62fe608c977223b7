"""``grader grade SUBMISSION --out DIR``: public and hidden suites -> DIR/results.json."""

from __future__ import annotations

from pathlib import Path

from grader.cli.common import grade_submission
from grader.errors import EXIT_OK


def cmd_grade(args) -> int:
    from grader.sandbox.backends import require_jail
    require_jail("grade")       # grading for points runs only in the jail
    from grader.cli.common import course_arg
    from grader.outputs.atomic import atomic_write_text
    from grader.outputs.gradescope import write_gradescope
    from grader.outputs.html import write_feedback_html
    from grader.outputs.junit import junit_xml
    from grader.cli.common import waited_s
    from grader.outputs.terminal import render_table

    result = grade_submission(Path(args.submission), course=course_arg(args),
                              labs=[args.lab] if args.lab else None)
    out = Path(args.out)
    write_gradescope(result, out / "results.json")
    if args.format == "junit":
        atomic_write_text(out / "results.xml", junit_xml(result))
    if args.html:
        write_feedback_html(result, out / "feedback.html")
    render_table(result, show_passed=not args.failures_only, waited_s=waited_s())
    print(f"Wrote {out / 'results.json'}" + (f" and {out / 'feedback.html'}" if args.html else ""))
    return EXIT_OK


def register(subparsers) -> None:
    p = subparsers.add_parser("grade", help="grade one submission with the public and hidden tests")
    p.add_argument("submission", help="a folder of lab files (or one lab file)")
    p.add_argument("--out", required=True, help="folder for results.json")
    p.add_argument("--lab", help="only this lab")
    p.add_argument("--format", choices=["gradescope", "junit"], default="gradescope",
                   help="junit also writes results.xml")
    p.add_argument("--failures-only", action="store_true", help="list only failing tests")
    p.add_argument("--html", action="store_true",
                   help="also write feedback.html (results, named mistakes, pictures)")
    p.set_defaults(func=cmd_grade)
