"""Where the course's files live: the repository that holds this package, unless overridden.

A course folder has the layout ``solutions/ exercises/ rubric.yaml``; the suites always
come with the package. Which course: the one ``use_course(DIR)`` chose (``grader --course
DIR``, before any command runs), else ``GRADER_COURSE_DIR``, else the folder that holds the
package (a checkout or an editable install). Every course path is read when it is used
(``paths.RUBRIC``, ``paths.SOLUTIONS`` ... are computed on access), never fixed at import.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
SUITES = PACKAGE / "suites"
KIT = PACKAGE.parent              # the kit's own course (a checkout of this repository)
ENV = "GRADER_COURSE_DIR"

# Course paths, relative to the course folder; read as module attributes (``paths.RUBRIC``).
_IN_COURSE = {"SOLUTIONS": "solutions", "EXERCISES": "exercises", "RUBRIC": "rubric.yaml",
              "EXAMPLES": "examples/submissions"}


def course() -> Path:
    """The course folder now: ``GRADER_COURSE_DIR`` (``use_course`` sets it), else the kit."""
    return Path(os.environ.get(ENV) or KIT).resolve()


def use_course(folder: str | Path) -> Path:
    """Point every later use of the course's paths at ``folder`` (``grader --course``).

    Set through the environment, so that the processes the grader starts (a batch's
    grading processes, the notebook check's subprocess) find the same course.
    """
    path = Path(folder).expanduser().resolve()
    os.environ[ENV] = str(path)
    return path


def __getattr__(name: str) -> Path:
    if name == "COURSE":
        return course()
    if name in _IN_COURSE:
        return course() / _IN_COURSE[name]
    raise AttributeError(f"module 'grader.paths' has no attribute {name!r}")
