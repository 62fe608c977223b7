"""``python -m grader.cli.kernel_grade [--course DIR]``: the notebook check's grading process.

A notebook's test cell (``grader.notebooks.check``) starts this process, hands it the
kernel's code as JSON on stdin and reads the result as JSON, the last line on stdout. As
every command does, it finds the course once (``--course``, else ``GRADER_COURSE_DIR``,
else the kit: ``common.resolve_course_dir``) and passes the ``Course`` down.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str] | None = None) -> int:
    import argparse

    from grader.cli.common import resolve_course_dir

    parser = argparse.ArgumentParser(prog="python -m grader.cli.kernel_grade",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--course", metavar="DIR", help="the course folder")
    args = parser.parse_args(argv)
    try:
        from grader.course import Course
        from grader.notebooks import kernel_grade

        request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
        reply = kernel_grade(request, Course(resolve_course_dir(args.course)))
    except Exception as exc:  # the kernel shows this as the reason the test could not run
        reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write("\n" + json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
