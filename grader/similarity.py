"""Code similarity between submissions: winnowed fingerprints of normalised tokens.

The method is the one MOSS, JPlag and Dolos use (Schleimer, Wilkerson and Aiken, "Winnowing:
local algorithms for document fingerprinting", SIGMOD 2003), over the standard library's
tokenizer:

1. **Normalise.** Each file is parsed (``ast``, never executed) and its syntax tree's nodes
   read in source order, one token each (a file that does not parse: the ``tokenize``
   tokens); comments, docstrings and layout leave no trace; every identifier becomes ``V``
   unless it is a builtin, or an attribute or keyword argument of the course's vocabulary
   (``x.softmax``, ``dim=``: the API a solution calls is its substance); numbers become
   ``N`` and strings ``S``. So renaming, re-commenting and reformatting change nothing.
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

import ast
import builtins
import io
import keyword
import tokenize
import zlib
from dataclasses import dataclass, field

import numpy as np

K = 10                     # tokens (tree nodes) per k-gram: about a line of code
W = 8                      # winnowing window: every match of >= K + W - 1 = 17 tokens is found
COMMON = 20                # a fingerprint held by more submissions than this is common code
_KEPT_NAMES = frozenset(keyword.kwlist) | frozenset(dir(builtins))
_SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
_STATEMENT_START = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL,
                    tokenize.ENCODING, None}


# A token is a tuple (normalised text: V, N, S, an operator or a kept name; the 1-based line
# where it starts; the line where it ends): tuples, as a class of 8,000 files makes millions.
Token = tuple


_UNITS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def normalised_tokens(source: str, vocabulary: frozenset[str] = frozenset()) -> list[list[Token]]:
    """The tokens of ``source``, normalised (module docstring), cut into units at every
    ``def``/``class``: the syntax tree's nodes in source order (layout, parentheses and
    comments leave no trace), or, for a file that does not parse, its lexical tokens."""
    tree = _parse_leniently(source)
    if tree is None:
        return lexical_tokens(source, vocabulary)
    units: list[list[Token]] = [[]]
    try:
        _visit(tree, units, vocabulary)
    except RecursionError:
        return lexical_tokens(source, vocabulary)
    return [u for u in units if u]


REPAIRS = 20               # lines blanked, at most, to parse a file with syntax errors


def _parse_leniently(source: str) -> ast.Module | None:
    """The syntax tree of ``source``; for a file with syntax errors, of the file with each
    offending line blanked (at most REPAIRS; line numbers kept), so that a copy with a typo
    left in is read as the copy it is; None when that does not parse either."""
    lines = source.splitlines(keepends=True)
    for _ in range(REPAIRS + 1):
        try:
            return ast.parse("".join(lines))
        except (SyntaxError, ValueError) as exc:
            where = getattr(exc, "lineno", None)
            if not where or not 1 <= where <= len(lines) or not lines[where - 1].strip():
                return None
            lines[where - 1] = "\n"
        except (RecursionError, MemoryError):
            return None
    return None


_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def _visit(node: ast.AST, units: list[list[Token]], vocabulary: frozenset[str],
           line: int = 1) -> None:
    """Append ``node``'s tokens, then its children's, in source order (pre-order)."""
    kind = type(node)
    line = getattr(node, "lineno", line)
    if kind in _UNITS:
        units.append([])
    out = units[-1]
    if kind is ast.Name:
        out.append((node.id if node.id in _KEPT_NAMES else "V", line, line))
        return
    if kind is ast.Constant:
        value = node.value
        text = ("S" if isinstance(value, (str, bytes)) else
                repr(value) if value is None or isinstance(value, bool) else "N")
        out.append((text, line, line))
        return
    if kind is ast.Expr and type(node.value) is ast.Constant and isinstance(node.value.value, str):
        return                                   # a docstring or a bare string: lesson text
    if kind is ast.Attribute:
        _visit(node.value, units, vocabulary, line)
        units[-1].append(("." + (node.attr if node.attr in vocabulary else "V"), line, line))
        return
    if kind is ast.keyword:
        out.append(((node.arg if node.arg in vocabulary else "V") + "=", line, line))
        _visit(node.value, units, vocabulary, line)
        return
    out.append((kind.__name__, line, line))
    fields = _CHILD_FIELDS.get(kind)
    if fields is None:
        fields = _CHILD_FIELDS[kind] = tuple(f for f in kind._fields if f != "ctx")
    for name in fields:
        value = getattr(node, name, None)
        if type(value) is list:
            for item in value:
                if isinstance(item, ast.AST):
                    _visit(item, units, vocabulary, line)
        elif isinstance(value, ast.AST):
            _visit(value, units, vocabulary, line)


def lexical_tokens(source: str, vocabulary: frozenset[str] = frozenset()) -> list[list[Token]]:
    """The standard tokenizer's tokens of ``source``, normalised as the syntax tree's are
    (for a file that does not parse); the units read before a tokenizer error."""
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
    """The attribute names (``x.NAME``) and keyword arguments (``f(NAME=...)``) the course's
    own code uses: kept when normalising (the API a solution calls is its substance)."""
    names: set[str] = set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            tree = None
        if tree is not None:
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute):
                    names.add(node.attr)
                elif isinstance(node, ast.keyword) and node.arg:
                    names.add(node.arg)
            continue
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
        got = _TOKEN_IDS[text] = zlib.crc32(text.encode("utf-8", "surrogatepass")) * 2 + 1
    return got


_NONE = np.uint64(np.iinfo(np.uint64).max)      # the hash of a k-gram that crosses a cut


def kgram_hashes(units: list[list[Token]], k: int = K) -> tuple[np.ndarray, np.ndarray]:
    """The hash of every run of ``k`` tokens of the file's units laid end to end (a run that
    crosses from one unit into the next hashes to ``_NONE``), and each token's line. A
    polynomial hash in uint64 arithmetic (wrapping): the same values on every run."""
    tokens = [t for unit in units for t in unit]
    if len(tokens) < k:
        return np.empty(0, np.uint64), np.empty(0, np.int64)
    ids = np.fromiter((_token_id(t[0]) for t in tokens), np.uint64, len(tokens))
    lines = np.fromiter((t[1] for t in tokens), np.int64, len(tokens))
    powers = np.array([pow(1_000_003, k - 1 - j, 1 << 64) for j in range(k)], np.uint64)
    with np.errstate(over="ignore"):
        hashes = (np.lib.stride_tricks.sliding_window_view(ids, k) * powers).sum(
            axis=1, dtype=np.uint64)
    unit_of = np.repeat(np.arange(len(units)), [len(u) for u in units])
    hashes[unit_of[:len(hashes)] != unit_of[k - 1:]] = _NONE
    return hashes, lines


@dataclass
class Fingerprints:
    """One submission's fingerprints: hash -> the line spans where it was selected."""
    spans: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.spans)


def fingerprint(source: str, *, vocabulary: frozenset[str] = frozenset(),
                boilerplate: frozenset[int] = frozenset(), k: int = K, w: int = W) -> Fingerprints:
    """The winnowed fingerprints of ``source`` less every ``boilerplate`` hash: in each
    window of ``w`` consecutive k-gram hashes, the smallest (the rightmost of equals)."""
    found = Fingerprints()
    hashes, lines = kgram_hashes(normalised_tokens(source, vocabulary), k)
    if not len(hashes):
        return found
    if len(hashes) < w:
        windows = hashes[None, :]
    else:
        windows = np.lib.stride_tricks.sliding_window_view(hashes, w)
    width = windows.shape[1]
    chosen = np.arange(len(windows)) + (width - 1 - windows[:, ::-1].argmin(axis=1))
    chosen = np.unique(chosen)
    chosen = chosen[hashes[chosen] != _NONE]
    starts, ends = lines[chosen].tolist(), lines[chosen + k - 1].tolist()
    for h, a, b in zip(hashes[chosen].tolist(), starts, ends, strict=True):
        if h not in boilerplate:
            found.spans.setdefault(h, []).append((a, b))
    return found


def boilerplate_hashes(sources: list[str], *, vocabulary: frozenset[str] = frozenset(),
                       k: int = K) -> frozenset[int]:
    """Every k-gram hash (not only the winnowed ones) of the given code."""
    out: set[int] = set()
    for source in sources:
        hashes, _ = kgram_hashes(normalised_tokens(source, vocabulary), k)
        out.update(hashes[hashes != _NONE].tolist())
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
