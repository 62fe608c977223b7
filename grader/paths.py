"""Where the grader's own files live: constants, the same for every course.

The course's files (rubric, solutions, exercises, secret) are a ``grader.course.Course``,
made once from the folder the command line names and passed down: no module finds the
course by itself, and nothing here reads the environment.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
SUITES = PACKAGE / "suites"
KIT = PACKAGE.parent              # the kit's own course (a checkout of this repository)
