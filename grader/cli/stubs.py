"""``grader stubs [--check]``: regenerate exercises/ from solutions/ (or report drift)."""

from __future__ import annotations

from grader.errors import EXIT_FAILED, EXIT_OK


def cmd_stubs(args) -> int:
    from grader.authoring.stubs import stub_drift, write_stubs
    from grader.cli.common import instructor_course_dir
    from grader.course import Course

    # Its folders only: no rubric is read (but a folder with none is no course).
    course = Course(instructor_course_dir(args, "stubs", "the course's exercises/"))

    if args.check:
        problems = stub_drift(solutions_dir=course.solutions, exercises_dir=course.exercises)
        for p in problems:
            print(p)
        print("stubs are in sync" if not problems else f"{len(problems)} stub problem(s)")
        return EXIT_FAILED if problems else EXIT_OK
    for path in write_stubs(solutions_dir=course.solutions, exercises_dir=course.exercises):
        print(f"wrote {path}")
    return EXIT_OK


def register(subparsers) -> None:
    p = subparsers.add_parser("stubs", help="regenerate exercises/ from solutions/")
    p.add_argument("--check", action="store_true", help="only report drift, write nothing")
    p.set_defaults(func=cmd_stubs)
