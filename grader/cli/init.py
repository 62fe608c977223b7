"""``grader init DIR``: a new course folder (rubric, solutions, exercises, README) from the kit."""

from __future__ import annotations


def cmd_init(args) -> int:
    from grader.authoring.new_course import init_course
    from grader.cli import version
    from grader.cli.common import course_dir_arg, course_named

    # The course to copy: --from, else the course named (--course, GRADER_COURSE_DIR), which
    # must be one, else the kit's (``kit_course``).
    in_use = course_dir_arg(args) if course_named(args) and not args.source else None
    dest = init_course(args.dir, source=args.source, version=version(), in_use=in_use)
    print(f"Created the course {dest}: rubric.yaml, solutions/, exercises/, README.md")
    print(f"Next: grader --course {dest} validate")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("init", help="instructors: create a new course folder from this "
                                           "kit (rubric.yaml, solutions/, exercises/)")
    p.add_argument("dir", help="the new course folder (must not exist, or be empty)")
    p.add_argument("--from", dest="source", metavar="COURSE",
                   help="copy this course folder instead of the kit's")
    p.set_defaults(func=cmd_init)
