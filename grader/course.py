"""The course: one object for what a grading needs of a course, made once and passed down.

A course folder has the layout ``solutions/ exercises/ rubric.yaml`` (``examples/`` and the
secret, ``.grader-secret``, optional); the suites come with the package (``paths.SUITES``).
A ``Course`` holds the folder, its rubric (parsed, and checked against the suites, once:
a rubric test with no suite test, or a suite test with no rubric entry, would silently cost
every student its points), the secret hidden inputs derive from (read, or made, once) and
the output mode. No module finds the course by itself: the command line resolves it
(``--course``, else ``GRADER_COURSE_DIR``, else the kit) and passes a ``Course`` down;
processes the grader starts get it, or its folder, as an argument.
"""

from __future__ import annotations

from pathlib import Path

from grader import paths
from grader.errors import RubricError
from grader.rubric import Rubric, check_rubric_against_suites, load_rubric
from grader.secret import course_secret, secret_path

RUBRIC_FILE = "rubric.yaml"


class Course:
    """The course in ``folder``; ``rubric``: a rubric file, or a loaded ``Rubric`` (a test's
    variant), instead of the folder's rubric.yaml; ``secret``: instead of the folder's.

    Nothing is read when it is made: the rubric on first use of ``rubric`` (then checked
    against the suites, ``RubricError`` listing every problem), the secret on first use of
    ``secret``; each once. Picklable (a batch's grading processes get it as an argument).
    """

    def __init__(self, folder: str | Path, rubric: Rubric | str | Path | None = None, *,
                 secret: bytes | None = None):
        self.folder = Path(folder).expanduser().resolve()
        if isinstance(rubric, Rubric):
            self.rubric_path = Path(rubric.path)
            self._rubric: Rubric | None = rubric
        else:
            self.rubric_path = Path(rubric) if rubric else self.folder / RUBRIC_FILE
            self._rubric = None
        self._problems: list[str] | None = None
        self._secret = secret

    def __repr__(self) -> str:
        return f"Course({str(self.folder)!r})"

    # -- the folder's parts ---------------------------------------------------------------
    @property
    def suites(self) -> Path:
        return paths.SUITES

    @property
    def solutions(self) -> Path:
        return self.folder / "solutions"

    @property
    def exercises(self) -> Path:
        return self.folder / "exercises"

    @property
    def examples(self) -> Path:
        return self.folder / "examples" / "submissions"

    @property
    def secret_path(self) -> Path:
        return secret_path(self.folder)

    @property
    def private_paths(self) -> tuple[str, ...]:
        """What no sandboxed worker may see of the course: the solutions, the rubric, the
        examples and the secret (``Zygote.hide``)."""
        return tuple(str(p) for p in (self.solutions, self.rubric_path, self.examples,
                                      self.secret_path))

    # -- what is read once ----------------------------------------------------------------
    def parsed_rubric(self) -> Rubric:
        """The rubric file, parsed and validated (once; ``RubricError`` with file:line),
        not yet checked against the suites (``rubric`` is)."""
        if self._rubric is None:
            self._rubric = load_rubric(self.rubric_path)
        return self._rubric

    def suite_problems(self) -> list[str]:
        """What the rubric and the suites disagree on (``path:line: reason``; checked once)."""
        if self._problems is None:
            self._problems = check_rubric_against_suites(self.parsed_rubric(), self.suites)
        return list(self._problems)

    @property
    def rubric(self) -> Rubric:
        """The rubric, parsed and checked against the suites on first use (``RubricError``
        listing every problem)."""
        problems = self.suite_problems()
        if problems:
            raise RubricError(problems)
        return self.parsed_rubric()

    @property
    def secret(self) -> bytes:
        """The course secret (read, or made, on first use; ``grader.secret``)."""
        if self._secret is None:
            self._secret = course_secret(self.folder)
        return self._secret

    @property
    def output_mode(self) -> str:
        """Who may read the files the grader writes: the rubric's ``output_mode``."""
        return self.rubric.output_mode
