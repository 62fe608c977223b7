"""``grader validate``: the instructor's self-check before releasing or grading."""

from __future__ import annotations

from grader.errors import EXIT_FAILED, EXIT_OK


def cmd_validate(args) -> int:
    from grader.authoring.validate import validate
    from grader.cli.common import course_dir_arg
    from grader.course import Course

    # Not ``course_arg``: a rubric that does not load is a line of the report, not an error;
    # no course (no folder, no rubric file) is one (``course_dir_arg``).
    report = validate(Course(course_dir_arg(args), args.rubric or None))
    for line in report.lines:
        print(line)
    return EXIT_OK if report.ok else EXIT_FAILED


def register(subparsers) -> None:
    p = subparsers.add_parser("validate", help="instructors: check solutions, stubs, rubric and suites agree")
    p.set_defaults(func=cmd_validate)
