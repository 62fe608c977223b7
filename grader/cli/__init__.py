"""``grader``: a thin command line over the Python API (grader.grading, grader.batch, ...).

One module per command (``grader.cli.<command>``), each with ``register(subparsers)``.
Every command returns an exit status (``grader.errors``): 0 success, 1 the work ran but
something failed (a test, a check), 2 bad input (a named file, line and reason), 3 the
grader itself failed. ``main`` turns every ``GraderError`` into ``error: <message>`` lines
and its exit code: never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from grader.errors import EXIT_INTERRUPTED, GraderError

# The commands, in the order ``grader --help`` lists them.
COMMANDS = ("check", "grade", "feedback", "validate", "stubs", "batch", "notebooks",
            "bundles")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="grader", description=__doc__.splitlines()[0])
    parser.add_argument("--rubric", help="rubric file (default: the course's rubric.yaml)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"grader.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except GraderError as exc:
        for line in exc.errors or [type(exc).__name__]:
            print(f"error: {line}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
