"""Code similarity between submissions: winnowed fingerprints of normalised tokens.

The method is the one MOSS, JPlag and Dolos use (Schleimer, Wilkerson and Aiken, "Winnowing:
local algorithms for document fingerprinting", SIGMOD 2003), over the standard library's
tokenizer:

1. **Normalise.** Each file is tokenized (``tokenize``, never executed); comments, docstrings,
   blank lines, indentation and line breaks are dropped; every identifier becomes ``V``
   unless it is a keyword, a builtin or an attribute of the course's vocabulary (``x.softmax``
   stays ``softmax``: the API a solution calls is its substance); numbers become ``N`` and
   strings ``S``. So renaming, re-commenting and reformatting change nothing.
2. **Split by function.** The tokens are cut at every ``def`` and ``class``, and no k-gram
   spans a cut, so functions in another order give the same fingerprints.
3. **Fingerprint.** Every run of ``k`` tokens is hashed (deterministic: the same report on
   every run); in each window of ``w`` consecutive hashes the smallest is kept
   (winnowing): any match of at least ``k + w - 1`` tokens is found, and a moved statement
   or an added line of dead code only changes the fingerprints that touch it.
4. **Boilerplate.** Every k-gram of the given code (the stubs the course hands out) is removed
   from every submission's fingerprints: the given code never counts as shared.
5. **Index, not all pairs.** An inverted index maps each fingerprint to the submissions that
   hold it; candidate pairs come only from fingerprints they share, and a fingerprint held by
   more than ``common`` submissions is common code (dropped, as MOSS's ``-m``), so the cost is
   linear in the number of fingerprints times a constant, never the square of the class.
6. **Score.** A pair's similarity is the shared fingerprints over the smaller of the two
   sets (a copy padded with dead code scores as the copy it is), with both directions kept.

A report is evidence for a person to read; it never changes a grade.
"""

from __future__ import annotations

import builtins
import io
import keyword
import tokenize
import zlib
from dataclasses import dataclass, field

K = 12                     # tokens per k-gram (about one line of code)
W = 8                      # winnowing window: every match of >= K + W - 1 = 19 tokens is found
COMMON = 20                # a fingerprint held by more submissions than this is common code
_KEPT_NAMES = frozenset(keyword.kwlist) | frozenset(dir(builtins))
_SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
_STATEMENT_START = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL,
                    tokenize.ENCODING, None}


# A token is a tuple (normalised text: V, N, S, an operator or a kept name; the 1-based line
# where it starts; the line where it ends): tuples, as a class of 8,000 files makes millions.
Token = tuple


def normalised_tokens(source: str, vocabulary: frozenset[str] = frozenset()) -> list[list[Token]]:
    """The tokens of ``source``, normalised (module docstring), cut into units at every
    ``def``/``class``; a file the tokenizer refuses gives the units read before the error."""
    units: list[list[Token]] = [[]]
    previous_type = None        # of the last token, skipped ones included
    previous_text = ""          # of the last significant token
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            kind, text = tok.type, tok.string
            if kind in _SKIPPED:
                previous_type = kind
                continue
            if kind == tokenize.STRING and previous_type in _STATEMENT_START:
                previous_type = kind            # a docstring or a bare string: lesson text
                continue
            if kind == tokenize.NAME:
                if text in ("def", "class") and units[-1]:
                    units.append([])
                if text in _KEPT_NAMES or (previous_text == "." and text in vocabulary):
                    norm = text
                else:
                    norm = "V"
            elif kind == tokenize.NUMBER:
                norm = "N"
            elif kind == tokenize.STRING:
                norm = "S"
            else:
                norm = text
            units[-1].append((norm, tok.start[0], tok.end[0]))
            previous_type, previous_text = kind, text
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return [u for u in units if u]


def vocabulary_of(sources: list[str]) -> frozenset[str]:
    """The attribute names (``x.NAME``) the course's own code uses: kept when normalising."""
    names: set[str] = set()
    for source in sources:
        previous = ""
        try:
            for tok in tokenize.generate_tokens(io.StringIO(source).readline):
                if tok.type == tokenize.NAME and previous == ".":
                    names.add(tok.string)
                if tok.type not in _SKIPPED:
                    previous = tok.string
        except (tokenize.TokenError, IndentationError, SyntaxError):
            continue
    return frozenset(names)


_TOKEN_IDS: dict[str, int] = {}


def _token_id(text: str) -> int:
    got = _TOKEN_IDS.get(text)
    if got is None:
        got = _TOKEN_IDS[text] = zlib.crc32(text.encode("utf-8", "surrogatepass")) + 1
    return got


def kgram_hashes(unit: list[Token], k: int = K) -> list[int]:
    """The hash of every run of ``k`` tokens of one unit (none when it is shorter): the hash
    of a tuple of ints, the same on every run (ints, unlike str, are never salted)."""
    if len(unit) < k:
        return []
    ids = [_token_id(t[0]) for t in unit]
    return [hash(tuple(ids[i:i + k])) for i in range(len(ids) - k + 1)]


@dataclass
class Fingerprints:
    """One submission's fingerprints: hash -> the line spans where it was selected."""
    spans: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.spans)


def fingerprint(source: str, *, vocabulary: frozenset[str] = frozenset(),
                boilerplate: frozenset[int] = frozenset(), k: int = K, w: int = W) -> Fingerprints:
    """The winnowed fingerprints of ``source`` less every ``boilerplate`` hash."""
    found = Fingerprints()
    for unit in normalised_tokens(source, vocabulary):
        hashes = kgram_hashes(unit, k)
        if not hashes:
            continue
        last = -1
        for start in range(max(1, len(hashes) - w + 1)):
            window = hashes[start:start + w]
            low = min(window)
            pos = start + len(window) - 1 - window[::-1].index(low)    # rightmost minimum
            if pos == last:
                continue
            last = pos
            if low in boilerplate:
                continue
            found.spans.setdefault(low, []).append((unit[pos][1], unit[pos + k - 1][2]))
    return found


def boilerplate_hashes(sources: list[str], *, vocabulary: frozenset[str] = frozenset(),
                       k: int = K) -> frozenset[int]:
    """Every k-gram hash (not only the winnowed ones) of the given code."""
    out: set[int] = set()
    for source in sources:
        for unit in normalised_tokens(source, vocabulary):
            out.update(kgram_hashes(unit, k))
    return frozenset(out)


@dataclass(frozen=True)
class Pair:
    """Two submissions and what they share (``a`` < ``b`` in the input order)."""
    a: str
    b: str
    shared: int                  # fingerprints held by both
    size_a: int                  # fingerprints of each, boilerplate and common code left out
    size_b: int

    @property
    def similarity(self) -> float:
        """Shared over the smaller set: 1.0 when one holds all of the other."""
        return self.shared / min(self.size_a, self.size_b) if min(self.size_a, self.size_b) else 0.0


def similar_pairs(prints: dict[str, Fingerprints], *, common: int = COMMON,
                  min_shared: int = 1) -> list[Pair]:
    """Every pair sharing at least ``min_shared`` fingerprints, most similar first, from an
    inverted index (fingerprint -> holders); fingerprints held by more than ``common``
    submissions count for no one."""
    names = list(prints)
    index: dict[int, list[int]] = {}
    for i, name in enumerate(names):
        for h in prints[name].spans:
            index.setdefault(h, []).append(i)
    sizes = [0] * len(names)
    counts: dict[tuple[int, int], int] = {}
    for holders in index.values():
        if len(holders) > common:
            continue
        for i in holders:
            sizes[i] += 1
        for x in range(len(holders)):
            for y in range(x + 1, len(holders)):
                key = (holders[x], holders[y])
                counts[key] = counts.get(key, 0) + 1
    pairs = [Pair(names[i], names[j], n, sizes[i], sizes[j])
             for (i, j), n in counts.items() if n >= min_shared]
    pairs.sort(key=lambda p: (-p.similarity, -p.shared, p.a, p.b))
    return pairs


def shared_lines(mine: Fingerprints, theirs: Fingerprints) -> list[tuple[int, int]]:
    """The line spans of ``mine`` whose fingerprints ``theirs`` also holds, merged, in order."""
    spans = sorted(s for h, found in mine.spans.items() if h in theirs.spans for s in found)
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
