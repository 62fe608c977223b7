"""``grader validate``: the instructor's self-check before releasing or grading."""

from __future__ import annotations

from grader.errors import EXIT_FAILED, EXIT_OK


def cmd_validate(args) -> int:
    from grader.authoring.validate import validate
    from grader.cli.common import rubric_path_arg

    report = validate(rubric_path=rubric_path_arg(args))
    for line in report.lines:
        print(line)
    return EXIT_OK if report.ok else EXIT_FAILED


def register(subparsers) -> None:
    p = subparsers.add_parser("validate", help="instructors: check solutions, stubs, rubric and suites agree")
    p.set_defaults(func=cmd_validate)
