"""``grader``: a thin command line over the Python API (grader.grading, grader.batch, ...).

One module per command (``grader.cli.<command>``), each with ``register(subparsers)``.
Every command returns an exit status (``grader.errors``): 0 success, 1 the work ran but
something failed (a test, a check), 2 bad input (a named file, line and reason), 3 the
grader itself failed. ``main`` turns every ``GraderError`` into ``error: <message>`` lines
and its exit code: never a traceback.

Building the parser imports no torch: command modules import what they need inside their
functions, so ``grader --help`` and ``grader <command> --help`` answer at once.
"""

from __future__ import annotations

import argparse
import sys

from grader.cli.common import resolve_course_dir
from grader.errors import EXIT_INTERRUPTED, GraderError

# The modules whose commands ``grader --help`` lists, in that order.
COMMANDS = ("check", "grade", "feedback", "init", "validate", "stubs", "batch", "notebooks",
            "bundles")
DISTRIBUTION = "attention-labs"


def version() -> str:
    """The installed package's version (its metadata), or 'unknown' when not installed."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="grader", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    parser.add_argument("--course", metavar="DIR",
                        help="the course folder (rubric.yaml, solutions/, exercises/); default: "
                             "$GRADER_COURSE_DIR, else the kit this grader came from")
    parser.add_argument("--rubric", help="rubric file (default: the course's rubric.yaml)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"grader.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        # The course is resolved here, once; commands make their ``Course`` from it
        # (``common.course_arg``) and pass it down.
        args.course_dir = resolve_course_dir(args.course)
        # A typo in the sandbox's setting is refused before anything runs.
        from grader.sandbox.backends import requested_mode
        requested_mode()
        return args.func(args)
    except GraderError as exc:
        for line in exc.errors or [type(exc).__name__]:
            print(f"error: {line}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print(f"interrupted{': ' + str(exc) if str(exc) else ''}", file=sys.stderr)
        return EXIT_INTERRUPTED
