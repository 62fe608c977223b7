"""``grader feedback SUBMISSION --out DIR``: grade and write an HTML feedback report."""

from __future__ import annotations

from pathlib import Path

from grader.cli.common import grade_submission


def cmd_feedback(args) -> int:
    from grader.cli.common import course_arg, labs_arg
    from grader.outputs.html import points_text, write_feedback_html

    from grader.sandbox.backends import backend_name
    visibility = ("public",) if args.public else ("public", "hidden")
    if backend_name() == "portable" and not args.public:
        # The hidden tests are graded only in the jail: here, the public ones.
        print("note: this machine runs the portable sandbox, so the feedback covers the "
              "public tests (the hidden ones run when your work is graded)")
        visibility = ("public",)
    result = grade_submission(Path(args.submission), course=course_arg(args),
                              labs=labs_arg(args.lab) or None, visibility=visibility)
    out = write_feedback_html(result, Path(args.out) / "feedback.html")
    failed = sum(1 for lab in result.labs for t in lab.tests if not t.passed)
    diagnosed = sum(1 for lab in result.labs for t in lab.tests if not t.passed and t.diagnosis)
    print(f"{points_text(result.score)}/{points_text(result.max_score)} points; {failed} failing test(s), "
          f"{diagnosed} with a named mistake")
    print(f"Wrote {out}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("feedback", help="grade a submission and write an HTML feedback report")
    p.add_argument("submission", help="a folder of lab files (or one lab file)")
    p.add_argument("--out", required=True, help="folder for feedback.html")
    p.add_argument("--lab", action="append", metavar="LAB",
                   help="only this lab, e.g. lab1_attention (repeat, or comma-separate)")
    p.add_argument("--public", action="store_true", help="only the public tests")
    p.set_defaults(func=cmd_feedback)
