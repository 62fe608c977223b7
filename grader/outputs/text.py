"""Text fit for any output: control characters and lone surrogates made harmless; and the
diagnoses that several failed tests of a lab share, so that a report writes each out once.

Text that came from student code has already been capped and visibility-filtered by the
engine; outputs also make it *printable*, because XML 1.0 cannot carry most control
characters at all and a CI log or terminal should not be repainted by escape sequences.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from grader.results import LabResult, SubmissionResult, TestResult

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


# ------------------------------------------------------------------------------------------
# a check's one line per lab
# ------------------------------------------------------------------------------------------


def short_name(lab: str) -> str:
    """``lab1_attention`` -> ``lab1`` (the lab's number is how students name it)."""
    m = re.match(r"lab\d+", lab)
    return m.group(0) if m else lab


def lab_summary(lab: LabResult) -> str:
    """One line for a lab of a check: ``lab1: 5/7 public tests pass`` (and why, if not run).
    The student kit's README shows one, made by this function from the rubric."""
    passed = sum(t.passed for t in lab.tests)
    counted = [t for t in lab.tests if not t.deferred]
    line = f"{short_name(lab.name)}: {passed}/{len(counted)} public tests pass"
    if len(counted) < len(lab.tests):
        line += f", {len(lab.tests) - len(counted)} measured when graded"
    if lab.reason:                           # the gist: the table lists the files found
        line += f" ({lab.reason})"
    return line


# ------------------------------------------------------------------------------------------
# labs not handed in: one line each, not a table of failures
# ------------------------------------------------------------------------------------------


def not_handed_in(lab: LabResult) -> bool:
    """The lab's file is not in the submission: every test failed for that one reason."""
    return lab.status == "missing"


def missing_lab_line(lab: LabResult) -> str:
    """"<lab> - <title>: 0/<max>: not handed in (<why>)"."""
    title = f"{lab.name} - {lab.title}" if lab.title else lab.name
    return (f"{title}: {lab.score:g}/{lab.max_score:g}: not handed in"
            + (f" ({lab.message})" if lab.message else ""))


def handed_in_text(result: SubmissionResult) -> str:
    """Which labs the totals cover, where some were not handed in ("" when all were)."""
    gone = [lab.name for lab in result.labs if not_handed_in(lab)]
    if not gone:
        return ""
    here = [lab.name for lab in result.labs if not not_handed_in(lab)]
    return (f"handed in: {', '.join(here) or 'none'} ({len(here)} of {len(result.labs)} "
            f"labs); not handed in: {', '.join(gone)}")


# ------------------------------------------------------------------------------------------
# diagnoses shared by several failed tests of a lab: written out once, referred to after
# ------------------------------------------------------------------------------------------


def diagnosis_name(diagnosis: str) -> str:
    """The mistake's name: a diagnosis is "<name>: <hint>" (grader.mistakes.Mistake)."""
    return diagnosis.split(": ", 1)[0].strip()


@dataclass(frozen=True)
class Cause:
    """One diagnosis and the failed tests of a lab that got it."""
    diagnosis: str
    tests: tuple[TestResult, ...]

    @property
    def name(self) -> str:
        return diagnosis_name(self.diagnosis)

    @property
    def hint(self) -> str:
        return self.diagnosis.split(": ", 1)[1].strip() if ": " in self.diagnosis else ""

    def summary(self) -> str:
        """"Likely cause: <name>: <hint> (seen in N tests)"."""
        return f"Likely cause: {self.diagnosis} (seen in {len(self.tests)} tests)"

    def reference(self) -> str:
        """What each of its tests says instead of the whole diagnosis."""
        return f"Diagnosis: see '{self.name}' above"


def shared_causes(lab: LabResult) -> list[Cause]:
    """The diagnoses that two or more failed tests of *lab* share (grouped by the whole
    string), most tests first, then in the order the lab's tests first show them."""
    groups: dict[str, list[TestResult]] = {}
    for t in lab.tests:
        if not t.passed and t.diagnosis:
            groups.setdefault(t.diagnosis, []).append(t)
    causes = [Cause(d, tuple(ts)) for d, ts in groups.items() if len(ts) > 1]
    return sorted(causes, key=lambda c: -len(c.tests))     # stable: ties keep their order


def cause_of(test: TestResult, causes: list[Cause]) -> Cause | None:
    """The shared cause that *test* belongs to, if any."""
    return next((c for c in causes if any(t is test for t in c.tests)), None)
