"""``grader batch ROOT --out DIR [--lab LAB] [--scheduler ADDRESS]``: grade a whole class
(see grader.batch)."""

from __future__ import annotations

import argparse
import os
import sys

from grader.errors import EXIT_FAILED, EXIT_OK


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def points(x: float) -> str:
    """A summary figure as printed: at most 2 decimals, no trailing zeros (63.33, 12)."""
    return f"{round(float(x), 2):.2f}".rstrip("0").rstrip(".")


def cmd_batch(args) -> int:
    from grader.sandbox.backends import require_jail
    require_jail("batch")       # grading for points runs only in the jail
    from pathlib import Path

    from grader.batch import grade_batch
    from grader.batch.progress import duration
    from grader.cli.common import course_arg, labs_arg

    labs = labs_arg(args.labs) or None
    if args.batch_rubric:
        args.rubric = args.batch_rubric
    summary = grade_batch(args.root, out=args.out, course=course_arg(args), jobs=args.jobs,
                          progress=not args.quiet, labs=labs, scheduler=args.scheduler,
                          worker_course=args.worker_course, similar_to=args.similar_to)
    if not args.quiet:
        print(f"{summary.students} students ({summary.graded} graded now, "
              f"{summary.up_to_date} up to date) in {duration(summary.seconds)}"
              + (f"; {summary.not_ok} could not be graded" if summary.not_ok else ""))
        if summary.mean is not None:
            print(f"total{' (' + ', '.join(labs) + ')' if labs else ''}: "
                  f"mean {points(summary.mean)}, median {points(summary.median)}, "
                  f"min {points(summary.min)}, max {points(summary.max)} "
                  f"(out of {points(summary.max_total)})")
        print(f"Wrote {summary.files['grades_csv']}, {Path(summary.files['summary_json']).name}"
              ", the plots, similarity.json/.csv (for the instructor: "
              "changes no grade) and class.html (the class dashboard)")
    if summary.internal_errors:
        print(f"{summary.internal_errors} student(s) hit a grader error; run the batch again "
              "to retry them", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "batch", help="grade a whole class in parallel (resumable): grades.csv, summary, plots")
    p.add_argument("root", help="folder with one entry per student: a folder of lab files "
                                "or a .zip of one (the name is the student id)")
    p.add_argument("--out", required=True, help="output folder (rerun with the same folder "
                                                "to resume; unchanged students are skipped)")
    p.add_argument("--lab", dest="labs", action="append", metavar="LAB",
                   help="grade only this lab (repeat, or comma-separate; default: all); "
                        "totals are out of its points")
    p.add_argument("--jobs", type=_positive_int, default=None,
                   help=f"grading processes (default: the number of CPUs, {os.cpu_count()})")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="grade on the Dask cluster at ADDRESS (tcp://host:8786) instead of "
                        "local processes (needs pip install 'attention-labs[cluster]'; "
                        "see docs/batch.md)")
    p.add_argument("--worker-course", dest="worker_course", metavar="DIR",
                   help="with --scheduler: the course folder on the worker machines (default: "
                        "the same path as the course here)")
    p.add_argument("--similar-to", dest="similar_to", action="append", metavar="DIR",
                   help="also compare every student with the solutions in DIR (past terms', "
                        "public ones; repeat for more) in the similarity report")
    p.add_argument("--rubric", dest="batch_rubric",
                   help="rubric file (default: the course's rubric.yaml)")
    p.add_argument("--quiet", action="store_true", help="no progress or summary lines")
    p.set_defaults(func=cmd_batch)
