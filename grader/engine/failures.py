"""What a student's call that failed looks like on the trusted side: ``StudentError`` (raised,
crashed, hung, not importable), the teaching sentence of each kind for public and hidden
tests, and the ``RecordedCall`` a test keeps of each call for the mistake diagnosis."""

from __future__ import annotations

import builtins
from dataclasses import dataclass

import torch

from grader.sandbox.usage import Measured


def _exception_names() -> frozenset[str]:
    """The exception type names a hidden test may show: Python's built-in exceptions and
    torch's own. Any other name is the student's choice, and so a channel out of the test."""
    names = {n for n, v in vars(builtins).items()
             if isinstance(v, type) and issubclass(v, BaseException)}
    for module in (torch, torch.linalg, torch.cuda):
        names |= {n for n, v in vars(module).items()
                  if isinstance(v, type) and issubclass(v, BaseException)}
    return frozenset(names)


SHOWN_EXCEPTIONS = _exception_names()
TEXT_CAP = 2000             # characters of any one piece of text from a worker


def _unscrubbed(text: str) -> str:
    return text


class StudentError(Exception):
    """Student code failed: raised, crashed, hung or could not be imported.

    ``kind`` is one of: exception, not_implemented, forbidden, import, timeout, crash.
    """

    def __init__(self, *, kind: str, type_name: str = "", mro=(), message: str = "",
                 where: str = "", lab: str = "", stdout: str = ""):
        self.kind, self.type_name, self.mro = kind, type_name, tuple(mro)
        self.message, self.where, self.lab, self.stdout = message, where, lab, stdout
        self.note = ""          # the grader's own words on where it came from (see Session)
        self.grader_words = False   # ``message`` is the grader's own (shown unscrubbed)
        super().__init__(self.describe(hidden=False))

    def describe(self, *, hidden: bool, scrub=None, type_scrub=None) -> str:
        """A teaching sentence. For a hidden test nothing the student's code chose: the
        kind of failure only, an exception's type by a fixed list of built-in and torch
        names ("an exception" for any other), no message, no place, no function name.
        ``scrub``: applied to every piece of text the student's code chose (type name,
        message, place) before it is shown (a graded run's public tests); ``type_scrub``:
        to the exception's type name after it."""
        if hidden:
            return self._describe_hidden()
        text = self._describe_public(scrub or _unscrubbed, type_scrub or _unscrubbed)
        return f"{text}. {self.note}" if self.note else text

    def _describe_public(self, scrub, type_scrub) -> str:
        where = scrub(self.where)
        message = self.message if self.grader_words else scrub(self.message)
        type_name = type_scrub(scrub(self.type_name))
        at = f" at {where}" if where else ""
        if self.kind == "not_implemented":
            return f"not implemented yet ({message or type_name}{at})"
        if self.kind == "timeout":
            return self.message                   # the grader's own words
        if self.kind == "crash":
            return f"your code crashed the worker process{at}: {message}"
        if self.kind == "forbidden":
            return f"forbidden API: {message}"
        if self.kind == "import":
            return f"{self.lab}.py could not be imported: {type_name}{at}: {message}"
        return f"your code raised {type_name}{at}: {message}"

    def _describe_hidden(self) -> str:
        if self.kind == "not_implemented":
            return "not implemented yet"
        if self.kind == "timeout":
            return self.message                   # the grader's own words
        if self.kind == "crash":
            return ("your code crashed the worker process (it exited or was killed before "
                    "answering, or wrote to the grader's channel)")
        if self.kind == "forbidden":
            return "your code used an API this lab may not use (see the lab's rules)"
        if self.kind == "import":
            return f"{self.lab}.py could not be imported"
        name = self.type_name if self.type_name in SHOWN_EXCEPTIONS else "an exception"
        return f"your code raised {name}"


class MissingRaise(AssertionError):
    """``student.raises`` saw no exception of the type due. Its words hold nothing of the
    test's inputs, so hidden tests show them too (``hidden``: without the place)."""

    def __init__(self, public: str, hidden: str | None = None):
        super().__init__(public)
        self.public, self.hidden = public, hidden if hidden is not None else public


class NotMeasuredHere(Exception):
    """A resource test on a machine whose kernel shows the grader no running process's
    figures (the portable backend on macOS or Windows): reported as measured when the work
    is graded (``TestStatus.DEFERRED``), never passed or failed here."""

    def __init__(self, what: str):
        super().__init__(
            f"{what} is measured when your work is graded: this machine's system shows the "
            "grader no figures of a running process (the portable backend), so this test is "
            "neither passed nor failed here, and no points are shown as lost")


class StudentTimeout(StudentError):
    pass


def _text(value, cap: int = TEXT_CAP) -> str:
    """A worker-sent value as capped text (a worker may send anything in any field)."""
    return (value if isinstance(value, str) else "")[:cap]


def _error_from_reply(err: dict, lab: str, stdout: str) -> StudentError:
    mro = err.get("mro")
    mro = [_text(m, 200) for m in mro[:64]] if isinstance(mro, list) else []
    mro = mro or [_text(err.get("type"), 200) or "Exception"]
    if "ForbiddenAPIError" in mro:
        kind = "forbidden"
    elif err.get("import_failed"):
        kind = "import"
    elif "NotImplementedError" in mro:
        kind = "not_implemented"
    else:
        kind = "exception"
    return StudentError(kind=kind, type_name=_text(err.get("type"), 200) or "Exception",
                        mro=mro, message=_text(err.get("message")),
                        where=_text(err.get("where"), 300), lab=lab, stdout=stdout)


MAX_RECORDED_CALLS = 200      # per test; a test making more keeps the first ones


@dataclass
class RecordedCall:
    """One student call of the current test: the request, and its value or its error."""
    lab: str
    req: dict
    value: object = None
    error: StudentError | None = None
    used: Measured | None = None        # what the call used (student.measure only)
