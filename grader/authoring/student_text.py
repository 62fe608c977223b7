"""The kit's words for a student: the lab contract and the stubs as ``grader release``
writes them.

The course's ``docs/LAB_CONTRACT.md`` speaks to instructors too (what ``solutions/``
implements, "Notes on this section, as implemented and graded", docs/security.md); the
stubs open with a line that says ``grader stubs`` made them from ``solutions/``. A student
has neither tool nor folder: the release keeps the contract's interface and rules, leaves
the instructor notes out, and opens each stub with a line about the file itself.
"""

from __future__ import annotations

import re

# The paragraphs that follow a section's contract, written for whoever grades it; they end
# where the next section starts.
_NOTES = re.compile(r"^Notes on this section, as implemented and graded.*?(?=^## |\Z)",
                    re.M | re.S)
_FIRST_PARAGRAPH = re.compile(r"\A(# [^\n]*\n\n)(.*?\n)\n", re.S)
STUDENT_INTRO = (
    "This is the public interface of the labs: the names, signatures, shapes and behaviours\n"
    "that your lab files must provide. The stubs in `exercises/` declare them, and every test\n"
    "(the public ones `grader check` runs and the autograder's hidden ones) calls them.\n"
    "**Do not rename, reorder or change anything here**: keep the given code, names and\n"
    "signatures, and fill in the TODOs.\n")
# Sentences of the contract's own text that point to what only the course holds.
_REWORDED = {
    "The project's\n    # docs/LAB_CONTRACT.md writes the given code out in full":
        "Your stub,\n    # exercises/lab8_train_transformer.py, holds the given code in full",
}

STUB_FIRST_LINE = re.compile(r"\A# Generated from solutions/\S+ by `grader stubs`\..*?(\r?\n)")


def student_contract(text: str) -> str:
    """The contract without its instructor notes, introduced for a student."""
    text = _NOTES.sub("", text)
    text = _FIRST_PARAGRAPH.sub(lambda m: m.group(1) + STUDENT_INTRO + "\n", text, count=1)
    for old, new in _REWORDED.items():
        text = text.replace(old, new)
    return re.sub(r"\n{3,}", "\n\n", text)


def student_stub(text: str, file: str) -> str:
    """A stub whose first line speaks of the lab file, not of how it was generated."""
    return STUB_FIRST_LINE.sub(
        lambda m: f"# {file}: fill in the TODOs; keep the given code, names and signatures "
                  f"(docs/LAB_CONTRACT.md).{m.group(1)}", text, count=1)
