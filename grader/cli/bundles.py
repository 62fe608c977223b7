"""``grader release``, ``grader gradescope`` and ``grader classroom``: bundles and CI grading."""

from __future__ import annotations

import json
import os
from pathlib import Path

from grader.cli.common import course_arg, grade_submission, labs_arg
from grader.errors import UsageError


def cmd_release(args) -> int:
    from grader.authoring.bundles import build_release

    out = build_release(args.out, course_arg(args),
                        classroom_workflow=args.classroom, title=args.title)
    count = sum(1 for f in out.rglob("*") if f.is_file())
    print(f"Wrote the student release to {out} ({count} files; no hidden tests, solutions "
          "or hidden points).")
    print(f"Students: cd {out.name} && pip install -e . && grader check")
    return 0


def cmd_gradescope(args) -> int:
    from grader.authoring.bundles import build_gradescope

    labs = labs_arg(args.labs)
    out = build_gradescope(args.out, course_arg(args), labs=labs,
                           timeout_s=args.timeout_min * 60,
                           worker_memory_mb=args.worker_memory_mb,
                           torch_index_url=args.torch_index_url,
                           wheels=Path(args.wheels) if args.wheels else None)
    rubric = course_arg(args).rubric
    points = sum(t.points for name in (labs or rubric.labs)
                 for t in rubric.labs[name].tests.values())
    print(f"Wrote {out} ({out.stat().st_size / 2**20:.1f} MiB).")
    print(f"On Gradescope: upload it as the autograder, set the assignment to {points:g} points "
          f"and its timeout to {args.timeout_min:g} minutes (or more).")
    return 0


def cmd_classroom(args) -> int:
    from grader.sandbox.backends import require_jail
    require_jail("classroom")   # grading for points runs only in the jail
    from rich.console import Console

    from grader.outputs.atomic import atomic_write_text
    from grader.outputs.classroom import classroom_encoded, classroom_payload
    from grader.outputs.terminal import render_table

    github_output = os.environ.get("GITHUB_OUTPUT") if args.github_output else None
    if args.github_output and not github_output:
        raise UsageError("--github-output needs the GITHUB_OUTPUT variable (set by GitHub "
                         "Actions)")
    visibility = ("public",) if args.public_only else ("public", "hidden")
    # Points either way: a graded run (its own inputs, the student's text stripped; #44).
    result = grade_submission(Path(args.submission), course=course_arg(args),
                              labs=[args.lab] if args.lab else None, visibility=visibility,
                              graded=True)
    render_table(result, console=Console(stderr=True))
    encoded = classroom_encoded(result)
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(classroom_payload(result), indent=2) + "\n")
    if github_output:
        with open(github_output, "a", encoding="utf-8") as fh:
            fh.write(f"result={encoded}\n")
    if not args.quiet:
        print(encoded)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("release", help="instructors: build the student bundle "
                                              "(exercises, public tests, no secrets)")
    p.add_argument("--out", required=True, help="a new (or empty) folder for the bundle")
    p.add_argument("--classroom", action="store_true",
                   help="add the GitHub Classroom workflow (.github/workflows/classroom.yml)")
    p.add_argument("--title", default="Attention labs", help="the README's title")
    p.set_defaults(func=cmd_release)

    p = subparsers.add_parser("gradescope", help="instructors: build the Gradescope "
                                                 "autograder zip (also the Classroom bundle)")
    p.add_argument("--out", required=True, help="the zip to write, e.g. autograder.zip")
    p.add_argument("--lab", dest="labs", action="append", metavar="LAB",
                   help="grade only this lab (repeat, or comma-separate); default: all")
    p.add_argument("--timeout-min", type=float, default=10.0,
                   help="the assignment's Gradescope timeout in minutes (default 10); "
                        "partial results are written shortly before it")
    p.add_argument("--worker-memory-mb", type=int, default=256,
                   help="memory a sandbox worker may add to the torch zygote (default 256)")
    p.add_argument("--torch-index-url", help="an extra package index for torch in setup.sh "
                                             "(e.g. PyTorch's CPU-only wheels)")
    p.add_argument("--wheels", help="a folder of .whl files to ship and install offline")
    p.set_defaults(func=cmd_gradescope)

    p = subparsers.add_parser("classroom", help="grade a submission and emit the GitHub "
                                                "Classroom reporter payload (base64 JSON)")
    p.add_argument("submission", help="a folder of lab files")
    p.add_argument("--lab", help="only this lab")
    p.add_argument("--public-only", action="store_true", help="run only the public tests")
    p.add_argument("--out", help="also write the decoded payload (JSON) here")
    p.add_argument("--github-output", action="store_true",
                   help="append result=<payload> to $GITHUB_OUTPUT (for the reporter step)")
    p.add_argument("--quiet", action="store_true", help="do not print the payload")
    p.set_defaults(func=cmd_classroom)
