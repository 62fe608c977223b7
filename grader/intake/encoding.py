"""A lab file's bytes -> UTF-8: what a Windows editor saves is graded as the same code.

Notepad's "ANSI", and many editors on Windows, save in Windows-1252 (cp1252): ``café`` or
curly quotes in a comment are then bytes that are not UTF-8 (``b'caf\\xe9 \\x93quoted\\x94'``).
``to_utf8`` re-encodes such a file to UTF-8 before it reaches a worker and says so in a
note. It guesses only where guessing is safe:

- valid UTF-8 (a BOM or not, CRLF or not) is kept byte for byte;
- a file with a UTF-8 BOM that is not UTF-8 after it is refused (the BOM says UTF-8);
- a file whose coding declaration (PEP 263, first two lines) names anything but cp1252 or
  UTF-8 is refused: it said what it is, and the grader reads lab files as UTF-8;
- otherwise a file that decodes as cp1252 (no undefined byte) is read as cp1252; its
  declaration, if it had one, is made to say utf-8 (same line, same place), so that every
  reader (the worker, tracebacks' source lines, the similarity check) reads the same text.

Runs in the trusted process; pure bytes in, bytes out.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

BOM = codecs.BOM_UTF8
# PEP 263's declaration, as the tokenizer looks for it.
CODING_RE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
WINDOWS = "cp1252"


class NotUTF8(ValueError):
    """The file is not UTF-8 and is not read as cp1252; the message says why, for the
    student (after the file's name)."""


@dataclass(frozen=True)
class Converted:
    data: bytes             # UTF-8
    note: str = ""          # what was done to it ("" when nothing)


def _codec(name: bytes) -> str | None:
    try:
        return codecs.lookup(name.decode("ascii")).name
    except (LookupError, UnicodeDecodeError):
        return None


def declared_coding(data: bytes) -> tuple[int, re.Match] | None:
    """(line index, match) of a coding declaration in the first two lines, if any."""
    for index, line in enumerate(data.split(b"\n", 2)[:2]):
        if (m := CODING_RE.match(line)) is not None:
            return index, m
        if index == 0 and line.strip() and not line.lstrip().startswith(b"#"):
            return None         # a declaration on line 2 counts only after a comment line
    return None


def to_utf8(data: bytes) -> Converted:
    """``data`` as UTF-8 (``Converted``); NotUTF8 where the grader will not guess."""
    try:
        data.decode("utf-8")
        return Converted(data)
    except UnicodeDecodeError as exc:
        first = exc
    line = data[: first.start].count(b"\n") + 1
    where = f":{line}: not UTF-8 text (byte 0x{data[first.start]:02x})"
    if data.startswith(BOM):
        raise NotUTF8(f"{where} after a UTF-8 byte order mark; save the file as UTF-8")
    declared = declared_coding(data)
    if declared is not None:
        index, m = declared
        codec = _codec(m.group(1))
        if codec not in (WINDOWS, "utf-8"):
            raise NotUTF8(f"{where}; it declares coding {m.group(1).decode('ascii', 'replace')}, "
                          "which the grader does not read: save the file as UTF-8")
    try:
        text = data.decode(WINDOWS)
    except UnicodeDecodeError:
        raise NotUTF8(f"{where}; save the file as UTF-8") from None
    out = text.encode("utf-8")
    if declared is not None:
        index, m = declared
        lines = out.split(b"\n", 2)
        old = lines[index]
        start, end = CODING_RE.match(old).span(1)
        lines[index] = old[:start] + b"utf-8" + old[end:]
        out = b"\n".join(lines)
    return Converted(out, note=(
        f"was not UTF-8 (first at line {line}): read as Windows-1252 (cp1252), the "
        "encoding Windows editors save in, and graded as UTF-8; save it as UTF-8 to be sure"))
