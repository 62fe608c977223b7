"""The grader's errors: one base, ``GraderError``, whose ``exit_code`` the command line returns.

Every error a user can meet is a ``GraderError``; ``grader.cli.main`` catches the base
alone and prints ``error: <message>`` (one line per problem, never a traceback). Exit codes:

- ``EXIT_BAD_INPUT`` (2): what the user gave is wrong (a path, a rubric, a zip, a notebook,
  an option); the message names the file, line and reason;
- ``EXIT_GRADER_FAULT`` (3): the grader itself could not go on (the sandbox, the pytest
  session, a batch's grading processes); never the student's fault, never a score.

Failures of student code are not errors here: they are test results (``grader.engine``).
This module imports nothing of the grader, so every layer may use it.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1          # the work ran, and something it checked failed (a test, a check)
EXIT_BAD_INPUT = 2
EXIT_GRADER_FAULT = 3
EXIT_INTERRUPTED = 130


class GraderError(Exception):
    """Base of every error that reaches a user. ``errors``: one problem per item."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, errors: list[str] | str = ""):
        if isinstance(errors, str):
            errors = [errors] if errors else []
        self.errors: list[str] = [str(e) for e in errors]
        super().__init__("\n".join(self.errors))


# -- bad input (exit 2) ---------------------------------------------------------------------

class UsageError(GraderError):
    """Bad input from the command line; the message names what and why."""


class SandboxModeError(UsageError):
    """GRADER_SANDBOX_MODE names no mode: a typo in a security setting is refused."""


class NeedsJail(UsageError):
    """A command that grades for points, run where only the portable backend can run."""


class SubmissionError(GraderError):
    """The submission as a whole cannot be graded (e.g. the path does not exist)."""


class ZipRejected(SubmissionError):
    """A zip that will not be unpacked; the message says why."""


class NotebookError(SubmissionError, ValueError):
    """A notebook that cannot be read or yields no gradable code; the message says why."""


class RubricError(GraderError):
    """rubric.yaml is invalid or disagrees with the suites; one ``file:line: problem`` each."""


class SuiteError(RubricError):
    """Problems in the test suites themselves (duplicate test names, syntax errors)."""


class StubError(GraderError):
    """A solution file that cannot be turned into a stub: ``path:line: reason`` each."""


class BundleError(GraderError):
    """A bundle cannot be built (bad option, leaked secret, unwritable output)."""


class ExportError(GraderError, ValueError):
    """Results that cannot be exported to nbgrader; the message names the file and why."""


class ConfigError(GraderError, ValueError):
    """autograder.json or an AUTOGRADER_* variable is invalid."""


# -- the grader's own faults (exit 3) -------------------------------------------------------

class GraderFault(GraderError):
    """The grader could not grade (not the student's doing): never scored, always retried."""

    exit_code = EXIT_GRADER_FAULT


class SandboxError(GraderFault, RuntimeError):
    """The sandbox (zygote or worker start-up) failed for a reason of its own."""


class GradingIncomplete(GraderFault):
    """A graded lab's test produced no outcome (a suite failed to load, a test did not
    run): nothing is scored, the submission is graded again."""


class RunnerError(GraderFault, RuntimeError):
    """The pytest session of a SuiteRunner stopped."""


class BatchError(GraderFault, RuntimeError):
    """The batch itself cannot go on (e.g. no grading process could start)."""


class CourseMismatch(UsageError):
    """A Dask worker of ``grader batch --scheduler`` has another course (rubric, suites,
    course secret, solutions or grader code) than the client: its grades would differ."""
