"""Text fit for any output: control characters and lone surrogates made harmless.

Text that came from student code has already been capped and visibility-filtered by the
engine; outputs also make it *printable*, because XML 1.0 cannot carry most control
characters at all and a CI log or terminal should not be repainted by escape sequences.
"""

from __future__ import annotations

import re

from grader.results import TestResult

# C0/C1 control characters except tab and newline, DEL, lone surrogates, and the two code
# points XML 1.0 forbids outright.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def capped(text: str, cap: int) -> str:
    """``text`` cut to ``cap`` characters, saying so when there is room to."""
    if len(text) <= cap:
        return text
    return text[: cap - 14] + " ... (cut off)" if cap > 28 else text[:cap]


def printable(text: str) -> str:
    """``text`` with control characters and lone surrogates replaced by U+FFFD."""
    return _UNPRINTABLE.sub("\ufffd", str(text).replace("\r\n", "\n").replace("\r", "\n"))


def failure_text(test: TestResult) -> str:
    """What a failing test tells the student: the filtered message and any diagnosis."""
    lines = [test.message] if test.message else []
    if test.diagnosis:
        lines.append(f"Diagnosis: {test.diagnosis}")
    return printable("\n".join(lines))
