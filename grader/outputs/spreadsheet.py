"""CSV files a spreadsheet opens as data, never as formulas (CSV injection).

A spreadsheet evaluates a cell whose text starts with ``=``, ``+``, ``-`` or ``@`` (and,
in some, a tab or carriage return before one of them) when the file is opened: a student
id taken from a folder or zip name such as ``=HYPERLINK("http://x.example","click")`` or
``-1+1`` would run in the instructor's spreadsheet. OWASP's advice, followed here for every
text cell: prefix such a cell with a single quote (the spreadsheet then shows it as text),
and quote every text field, so that an importer that splits on another separator (``;`` in
many locales, a tab) cannot start a new cell inside one (``alice;=1+1``).

Numbers stay numbers: they are written unquoted by the grader's own formatting, never from
text a student chose, so a negative score is ``-1.5`` and not text. Every CSV the grader
writes goes through :func:`writer`, which decides per cell by its Python type.
"""

from __future__ import annotations

import csv
import math
from typing import IO, Iterable

# What makes a cell a formula (OWASP: = + - @, tab 0x09, carriage return 0x0D).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# Leading characters some spreadsheets skip before they look for a formula.
_SKIPPED = " \t\r\n"


def text_cell(value: str) -> str:
    """``value`` as a cell that no spreadsheet evaluates: a single quote before a text that
    starts, or starts after blanks, with a formula character; other text unchanged."""
    value = str(value)
    if value.startswith(FORMULA_STARTS) or value.lstrip(_SKIPPED).startswith(FORMULA_STARTS):
        return "'" + value
    return value


def number_cell(x: float) -> int | float:
    """Points as a CSV cell: 12 rather than 12.0, at most 4 decimals; written unquoted."""
    x = round(float(x), 4)
    if not math.isfinite(x):
        return x
    return int(x) if x == int(x) else x


class SafeWriter:
    """``csv.writer`` whose rows are checked cell by cell: ``str`` cells pass through
    :func:`text_cell` and are quoted, ``int``/``float`` cells are numbers (unquoted);
    anything else is a bug in the caller (a TypeError), not a guess."""

    def __init__(self, fh: IO[str]):
        # QUOTE_NONNUMERIC: every str field quoted, ints and floats written bare.
        self._writer = csv.writer(fh, quoting=csv.QUOTE_NONNUMERIC)

    def writerow(self, cells: Iterable) -> None:
        self._writer.writerow([_cell(c) for c in cells])


def _cell(value):
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"a CSV cell must be text or a number, not {type(value).__name__}")
    if isinstance(value, str):
        return text_cell(value)
    return value


def writer(fh: IO[str]) -> SafeWriter:
    """The one way the grader writes CSV rows (see the module docstring)."""
    return SafeWriter(fh)
