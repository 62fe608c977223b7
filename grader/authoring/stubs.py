"""Generate student stubs (``exercises/``) from reference solutions (``solutions/``).

The marker syntax and the exact stub output are fixed in docs/internals.md, section 1:
each ``# BEGIN SOLUTION`` ... ``# END SOLUTION`` region (inside a function or method
body) becomes ``# TODO(Lab N): <hint>`` lines and a
``raise NotImplementedError("Lab N: <name>")``; everything else is copied unchanged.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from grader.errors import StubError
from grader.outputs.atomic import atomic_write_text

__all__ = [
    "Region",
    "StubError",
    "leaked_solution_lines",
    "solution_regions",
    "strip_solutions",
    "stub_drift",
    "write_stubs",
]

HEADER = "# Generated from solutions/{file} by `grader stubs`. Fill in the TODOs; keep the given code."

_BEGIN_RE = re.compile(r"#\s*BEGIN SOLUTION\s*")
_END_RE = re.compile(r"#\s*END SOLUTION\s*")
# Anything that looks like an attempt at a marker; it must then be an exact one.
_MARKERISH_RE = re.compile(r"#\s*(BEGIN|END)[\s_-]*SOLUTIONS?\b", re.IGNORECASE)
_HINT_RE = re.compile(r"\s*#\s*hint:\s?(.*?)\s*", re.IGNORECASE)
_LAB_FILE_RE = re.compile(r"lab(\d+)_")

_MIN_LEAK_LEN = 12  # shorter solution lines are too generic to call a leak
_DIFF_LINES = 20  # lines of unified diff shown for a stale stub


@dataclass(frozen=True)
class Region:
    start_line: int  # line of ``# BEGIN SOLUTION`` (1-based)
    end_line: int  # line of ``# END SOLUTION``
    func_name: str  # enclosing function; "Class.method" for methods
    hints: tuple[str, ...]  # text of the ``# hint:`` lines directly after BEGIN
    code_lines: tuple[str, ...]  # the lines after the hints, up to END (no line endings)
    indent: str = ""  # the markers' indentation
    lab: int = 0  # lab number from the file name


# --------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------


def _lines(source: str) -> list[str]:
    """Physical lines with their endings (``\\n``, ``\\r\\n``)."""
    return source.splitlines(keepends=True)


def _strip_eol(line: str) -> str:
    return line.rstrip("\r\n")


def _eol(line: str) -> str:
    return line[len(_strip_eol(line)) :] or "\n"


def _indent_of(line: str) -> str:
    text = _strip_eol(line)
    return text[: len(text) - len(text.lstrip(" \t"))]


def _show_indent(indent: str) -> str:
    if not indent:
        return "no indentation"
    if set(indent) == {" "}:
        return f"{len(indent)} space{'s' if len(indent) != 1 else ''}"
    return repr(indent)


def _qualnames(tree: ast.AST) -> list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    """Every function in *tree* with its dotted name (classes and enclosing functions)."""
    found: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                found.append((child, name))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def _stmt_start(stmt: ast.stmt) -> int:
    """First line of *stmt*, decorators included."""
    decorators = getattr(stmt, "decorator_list", None) or []
    return min([stmt.lineno] + [d.lineno for d in decorators])


def _scan(source: str, path: str) -> tuple[list[tuple[int, str, str]], set[int]]:
    """(markers, code lines): markers are (line, "BEGIN"|"END", indent) for whole-line
    marker comments; code lines are the lines holding any token but comments."""
    markers: list[tuple[int, str, str]] = []
    code: set[int] = set()
    skip = {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENCODING,
        tokenize.ENDMARKER,
    }
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError) as exc:  # ast.parse already passed; be safe
        raise StubError(f"{path}:1: cannot tokenize: {exc}") from None
    for tok in tokens:
        if tok.type not in skip:
            code.update(range(tok.start[0], tok.end[0] + 1))
            continue
        if tok.type != tokenize.COMMENT:
            continue
        if not _MARKERISH_RE.match(tok.string):
            continue
        line = tok.start[0]
        whole_line = tok.line[: tok.start[1]].strip() == ""
        kind = "BEGIN" if _BEGIN_RE.fullmatch(tok.string) else "END" if _END_RE.fullmatch(tok.string) else None
        if kind is None:
            raise StubError(
                f"{path}:{line}: malformed solution marker {tok.string.strip()!r}; "
                "write '# BEGIN SOLUTION' or '# END SOLUTION'"
            )
        if not whole_line:
            raise StubError(
                f"{path}:{line}: '# {kind} SOLUTION' must be a comment line of its own, not after code"
            )
        markers.append((line, kind, _indent_of(tok.line)))
    return markers, code


def _pairs(markers: list[tuple[int, str, str]], path: str) -> list[tuple[int, int, str]]:
    pairs: list[tuple[int, int, str]] = []
    open_: tuple[int, str] | None = None
    for line, kind, indent in markers:
        if kind == "BEGIN":
            if open_ is not None:
                raise StubError(
                    f"{path}:{line}: nested BEGIN SOLUTION (the region opened at line "
                    f"{open_[0]} is not closed yet); regions may not nest"
                )
            open_ = (line, indent)
        else:
            if open_ is None:
                raise StubError(f"{path}:{line}: END SOLUTION without a BEGIN SOLUTION")
            begin, begin_indent = open_
            if indent != begin_indent:
                raise StubError(
                    f"{path}:{line}: END SOLUTION is indented with {_show_indent(indent)}, "
                    f"its BEGIN SOLUTION (line {begin}) with {_show_indent(begin_indent)}; "
                    "a pair must have the same indentation"
                )
            pairs.append((begin, line, begin_indent))
            open_ = None
    if open_ is not None:
        raise StubError(f"{path}:{open_[0]}: BEGIN SOLUTION has no matching END SOLUTION")
    return pairs


def solution_regions(source: str, *, path: str) -> list[Region]:
    """The solution regions of *source* (file *path*, used in messages and for the lab
    number), in file order.  StubError (``path:line: reason``) for a file that is not
    valid Python, malformed/unpaired/nested markers, BEGIN and END with different
    indentation, a region outside a function body, or a lab number missing from the
    file name."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise StubError(f"{path}:{exc.lineno or 1}: not valid Python: {exc.msg}") from None
    lines = _lines(source)
    markers, code = _scan(source, path)
    pairs = _pairs(markers, path)
    if not pairs:
        return []

    m = _LAB_FILE_RE.match(Path(path).name)
    if m is None:
        raise StubError(
            f"{path}:{pairs[0][0]}: file name {Path(path).name!r} does not start with "
            "lab<N>_, so the lab number for the TODOs is unknown"
        )
    lab = int(m.group(1))

    functions = _qualnames(tree)
    n_lines = len(lines)
    statements = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]

    def extent_end(fn: ast.AST) -> int:
        """Last line that still belongs to *fn*'s block (comments after its last
        statement, up to the next code line, count)."""
        after = [ln for ln in code if ln > fn.end_lineno]  # type: ignore[attr-defined]
        return (min(after) - 1) if after else n_lines

    regions: list[Region] = []
    for begin, end, indent in pairs:
        best: tuple[ast.AST, str] | None = None
        for fn, name in functions:
            if (
                fn.lineno < begin
                and end <= extent_end(fn)
                and len(indent) > fn.col_offset
                and (best is None or fn.lineno > best[0].lineno)  # type: ignore[attr-defined]
            ):
                best = (fn, name)
        if best is None:
            raise StubError(
                f"{path}:{begin}: solution region (lines {begin}-{end}) is not inside a function "
                "or method body"
            )
        covered: set[int] = set()
        for stmt in statements:
            s_line = _stmt_start(stmt)
            s_end = stmt.end_lineno or stmt.lineno
            if not hasattr(stmt, "body") and (s_line < begin < s_end or s_line < end < s_end):
                marker = begin if s_line < begin < s_end else end
                raise StubError(
                    f"{path}:{marker}: solution marker inside the statement at line {s_line}; "
                    "a region must hold whole statements"
                )
            if not begin < s_line < end:
                continue
            if stmt.col_offset < len(indent):
                raise StubError(
                    f"{path}:{stmt.lineno}: code in the solution region (lines {begin}-{end}) is "
                    f"indented less than its BEGIN SOLUTION ({_show_indent(indent)})"
                )
            if s_end > end:
                raise StubError(
                    f"{path}:{end}: END SOLUTION is inside the statement at line {s_line}; "
                    "a region must hold whole statements"
                )
            if isinstance(stmt, ast.If) and lines[stmt.lineno - 1].lstrip().startswith("elif"):
                raise StubError(
                    f"{path}:{stmt.lineno}: an elif branch cannot start a solution region; "
                    "put the whole if statement, or the branch's body, in the region"
                )
            covered.update(range(s_line, s_end + 1))
        for ln in sorted(code):
            if begin < ln < end and ln not in covered:
                raise StubError(
                    f"{path}:{ln}: this line of the solution region (lines {begin}-{end}) belongs to "
                    "a statement that starts before BEGIN SOLUTION (an else:/except:/finally: "
                    "clause?); a region must hold whole statements"
                )

        body = [_strip_eol(line) for line in lines[begin : end - 1]]
        hints: list[str] = []
        for text in body:
            hm = _HINT_RE.fullmatch(text)
            if hm is None:
                break
            hints.append(hm.group(1))
        regions.append(
            Region(
                start_line=begin,
                end_line=end,
                func_name=best[1],
                hints=tuple(hints),
                code_lines=tuple(body[len(hints) :]),
                indent=indent,
                lab=lab,
            )
        )
    return regions


# --------------------------------------------------------------------------------------
# Stub text
# --------------------------------------------------------------------------------------


def _replacement(region: Region, eol: str) -> list[str]:
    tag = f"TODO(Lab {region.lab})"
    todo = list(region.hints) or [f"implement {region.func_name}."]
    out = [f"{region.indent}# {tag}: {hint}".rstrip() + eol for hint in todo]
    out.append(f'{region.indent}raise NotImplementedError("Lab {region.lab}: {region.func_name}"){eol}')
    return out


def strip_solutions(source: str, *, path: str) -> str:
    """The stub text for solution file *path* (its base name goes into the header line)."""
    regions = solution_regions(source, path=path)
    lines = _lines(source)
    first_eol = _eol(lines[0]) if lines else "\n"
    out: list[str] = [HEADER.format(file=Path(path).name) + first_eol]
    origin: list[int] = [0]  # source line of each stub line (0: generated header)
    pos = 0  # 0-based index of the next source line to copy
    for region in regions:
        for i in range(pos, region.start_line - 1):
            out.append(lines[i])
            origin.append(i + 1)
        new = _replacement(region, _eol(lines[region.start_line - 1]))
        out.extend(new)
        origin.extend([region.start_line] * len(new))
        pos = region.end_line
    for i in range(pos, len(lines)):
        out.append(lines[i])
        origin.append(i + 1)
    stub = "".join(out)
    try:
        ast.parse(stub, filename=path)
    except SyntaxError as exc:
        stub_line = exc.lineno or 1
        src_line = origin[stub_line - 1] if 0 < stub_line <= len(origin) else 1
        raise StubError(
            f"{path}:{src_line or 1}: the generated stub would not be valid Python "
            f"({exc.msg} at stub line {stub_line})"
        ) from None
    return stub


# --------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def _solution_files(solutions_dir: Path) -> list[Path]:
    return sorted(p for p in solutions_dir.glob("lab*.py") if p.is_file())


def _write_atomic(target: Path, text: str) -> None:
    """Replace ``target`` atomically, keeping its permission bits (0644 for a new file)."""
    mode = (target.stat().st_mode & 0o777) if target.exists() else 0o644
    atomic_write_text(target, text, file_mode=mode, newline="")


def _expected_stubs(solutions_dir: Path) -> tuple[dict[str, str], list[str]]:
    stubs: dict[str, str] = {}
    errors: list[str] = []
    for sol in _solution_files(solutions_dir):
        try:
            stubs[sol.name] = strip_solutions(_read(sol), path=str(sol))
        except StubError as exc:
            errors.extend(exc.errors)
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(f"{sol}:1: cannot read: {exc}")
    return stubs, errors


def write_stubs(*, solutions_dir: str | Path, exercises_dir: str | Path) -> list[Path]:
    """(Re)write ``exercises_dir/<name>`` for every ``solutions_dir/lab*.py``; returns the
    written paths.  All stubs are generated before any is written: a StubError (listing
    every failing file) leaves ``exercises_dir`` untouched.  Each write is atomic."""
    solutions_dir, exercises_dir = Path(solutions_dir), Path(exercises_dir)
    stubs, errors = _expected_stubs(solutions_dir)
    if errors:
        raise StubError(errors)
    exercises_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, text in stubs.items():
        target = exercises_dir / name
        _write_atomic(target, text)
        written.append(target)
    return written


def _short_diff(expected: str, actual: str, stub: Path, solution: Path) -> str:
    diff = list(
        difflib.unified_diff(
            actual.splitlines(),
            expected.splitlines(),
            fromfile=str(stub),
            tofile=f"generated from {solution}",
            lineterm="",
            n=1,
        )
    )
    if len(diff) > _DIFF_LINES:
        diff = diff[:_DIFF_LINES] + [f"... ({len(diff) - _DIFF_LINES} more diff lines)"]
    return "\n".join("    " + line for line in diff)


def stub_drift(*, solutions_dir: str | Path, exercises_dir: str | Path) -> list[str]:
    """Human-readable problems: stubs that are missing, stale (with a short diff) or extra
    (an ``exercises/lab*.py`` with no solution), and solutions that cannot be stubbed."""
    solutions_dir, exercises_dir = Path(solutions_dir), Path(exercises_dir)
    stubs, problems = _expected_stubs(solutions_dir)
    for name, expected in stubs.items():
        stub = exercises_dir / name
        if not stub.is_file():
            problems.append(f"{stub}: missing stub for {solutions_dir / name} (run `grader stubs`)")
            continue
        try:
            actual = _read(stub)
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{stub}: cannot read: {exc}")
            continue
        if actual != expected:
            if actual.replace("\r\n", "\n") == expected.replace("\r\n", "\n"):
                detail = "    (only line endings differ)"
            else:
                detail = _short_diff(expected, actual, stub, solutions_dir / name)
            problems.append(
                f"{stub}: stale stub, differs from what {solutions_dir / name} generates "
                f"(run `grader stubs`):\n{detail}"
            )
    solution_names = {p.name for p in _solution_files(solutions_dir)}
    if exercises_dir.is_dir():
        for stub in sorted(exercises_dir.glob("lab*.py")):
            if stub.name not in solution_names:
                problems.append(f"{stub}: extra stub, there is no {solutions_dir / stub.name}")
    return problems


def _normalized(line: str) -> str:
    return line.strip()


def leaked_solution_lines(*, solutions_dir: str | Path, exercises_dir: str | Path) -> list[str]:
    """``exercises/labN_x.py:LINE: contains solution code: `...` `` for every line of a stub
    that equals (whitespace stripped) a non-trivial line of a solution region: not blank,
    not a comment, at least 12 characters, and not also present outside the regions of
    that solution (given code).  Unreadable or unstubbable solutions are reported too."""
    solutions_dir, exercises_dir = Path(solutions_dir), Path(exercises_dir)
    problems: list[str] = []
    for sol in _solution_files(solutions_dir):
        stub = exercises_dir / sol.name
        if not stub.is_file():
            continue  # stub_drift reports it
        try:
            source = _read(sol)
            regions = solution_regions(source, path=str(sol))
            stub_text = _read(stub)
        except StubError as exc:
            problems.extend(exc.errors)
            continue
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{sol}:1: cannot read: {exc}")
            continue
        in_region: set[int] = set()
        for r in regions:
            in_region.update(range(r.start_line, r.end_line + 1))
        source_lines = source.splitlines()
        outside = {_normalized(t) for i, t in enumerate(source_lines, 1) if i not in in_region}
        secret: set[str] = set()
        for r in regions:
            for text in r.code_lines:
                t = _normalized(text)
                if len(t) < _MIN_LEAK_LEN or t.startswith("#") or t in outside:
                    continue
                secret.add(t)
        for lineno, text in enumerate(stub_text.splitlines(), 1):
            t = _normalized(text)
            if t in secret:
                problems.append(f"{stub}:{lineno}: contains solution code: `{t}`")
    return problems
