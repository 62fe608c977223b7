"""``grader notebooks`` (build the nbgrader course) and ``grader nbgrader-export``."""

from __future__ import annotations

from pathlib import Path

from grader.cli.common import course_arg, instructor_course_dir


def cmd_notebooks(args) -> int:
    from grader.authoring.course_notebooks import course_drift, write_course

    # A student kit: the notebooks are built from the solutions, which it does not hold.
    folder = instructor_course_dir(
        args, "notebooks", "the course's notebooks",
        " (notebook classes get their notebooks from nbgrader's release)")
    out = Path(args.out) if args.out else folder / "notebooks"
    course = course_arg(args)
    kwargs = {"labs": [args.lab] if args.lab else None,
              "include_dependencies": args.include_dependencies}
    if args.check:
        problems = course_drift(out, course, **kwargs)
        for p in problems:
            print(p)
        print("notebooks are in sync" if not problems else f"{len(problems)} notebook problem(s)")
        return 1 if problems else 0
    for path in write_course(out, course, **kwargs):
        print(f"wrote {path}")
    return 0


def cmd_nbgrader_export(args) -> int:
    from grader.authoring.nbgrader_bridge import export_results, load_result_files

    skipped: list[str] = []
    results = load_result_files([Path(p) for p in args.results], student=args.student,
                                skipped=skipped)
    if skipped:
        print(f"skipped {len(skipped)} file(s) that hold no grader result: "
              + ", ".join(skipped[:5]) + (f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""))
    report = export_results(args.db, results, score=args.score,
                            include_missing=args.include_missing)
    for line in report.lines:
        print(line)
    return 0 if report.ok else 1


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "notebooks", help="instructors: build the nbgrader course (source/<lab>/<lab>.ipynb)")
    p.add_argument("--out", help="the nbgrader course folder (default: notebooks/ in the course)")
    p.add_argument("--lab", help="only this lab")
    p.add_argument("--check", action="store_true",
                   help="only report notebooks that differ from what would be written")
    p.add_argument("--include-dependencies", action="store_true",
                   help="ship the reference code of the labs a lab imports (lab2 imports "
                        "lab1_attention) with its assignment; by default students bring their own")
    p.set_defaults(func=cmd_notebooks)

    p = subparsers.add_parser(
        "nbgrader-export",
        help="instructors: put grader results (results.json files, batch output) into an nbgrader gradebook")
    p.add_argument("results", nargs="+",
                   help="result files or folders searched for them (grader grade --out, grader batch)")
    p.add_argument("--db", required=True, help="the gradebook, e.g. sqlite:///course/gradebook.db")
    p.add_argument("--score", choices=["auto", "manual"], default="auto",
                   help="write the scores as nbgrader auto scores (default) or as manual scores, "
                        "which override what nbgrader autograde computes")
    p.add_argument("--student", help="the student id, when exporting one result file")
    p.add_argument("--include-missing", action="store_true",
                   help="also record 0 points for labs the submission did not contain")
    p.set_defaults(func=cmd_nbgrader_export)


