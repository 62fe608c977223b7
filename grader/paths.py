"""Where the course's files live: the repository that holds this package, unless overridden.

``GRADER_COURSE_DIR`` points the grader at another course folder with the same layout
(``solutions/ exercises/ rubric.yaml``); the suites always come with the package.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
COURSE = Path(os.environ.get("GRADER_COURSE_DIR") or PACKAGE.parent).resolve()
SOLUTIONS = COURSE / "solutions"
EXERCISES = COURSE / "exercises"
RUBRIC = COURSE / "rubric.yaml"
SUITES = PACKAGE / "suites"
EXAMPLES = COURSE / "examples" / "submissions"
