"""A lab's Python source from a Jupyter notebook: a submitted ``labN_x.ipynb``, or the cells a
kernel has run (the autograder test cells of the generated notebooks, see grader.notebooks).

The grader grades a notebook like the ``.py`` file it stands for. That file is built from the
notebook's code cells, in notebook order, so that Python's own semantics decide (the last
definition of a name wins), and it is made tolerant of what students do to notebooks:

- cells that were deleted, reordered, split, merged or retyped are fine: cell metadata is not
  needed, only the code; the lab's given imports (from ``solutions/``, never a lab module) are put
  on line 1, so a deleted or moved import cell costs nothing;
- autograder test cells are left out: nbgrader "Autograder tests" cells (``grade`` and not
  ``solution``) and any cell that holds :data:`TEST_CELL_MARKER` or uses ``grader.notebooks.check``;
- the generated notebooks' scratch cell (:data:`SCRATCH_CELL_MARKER`) is left out, whatever it
  holds;
- IPython syntax is left out: ``%magic`` and ``!shell`` lines, ``name?`` help lines, and cells
  run by a cell magic other than ``%%time``/``%%capture``;
- a cell that is not valid Python on its own is left out, with a note (in a kernel it would not
  have run either);
- only definitions are graded: top-level statements that would *run* the student's code while
  the file is imported (calls of the notebook's own functions and classes, and anything using
  their results), bare expressions (``print(...)``, ``out.shape``), ``assert``\\ s, statements that
  name a forbidden API (comparisons with PyTorch's reference) and imports of modules that the
  grading environment lacks (``matplotlib``) are left out, with a note. The rule is per
  statement, however they are laid out: several statements on one line (``a = 1; f(a)``)
  are filtered one by one, exactly as on separate lines. Left-out text is blanked (``pass``
  where a kept statement shares its line), so line numbers inside each cell stay the same.

Stored outputs are ignored. This module is light (no torch, no nbformat): the in-kernel test
cells import it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from grader.errors import NotebookError
from grader.intake.encoding import NotUTF8, to_utf8

__all__ = [
    "Cell",
    "Extracted",
    "NotebookError",
    "HIDDEN_TESTS_GRADE_ID",
    "SCRATCH_CELL_MARKER",
    "TEST_CELL_MARKER",
    "extract_lab_source",
    "given_imports",
    "hidden_test_id",
    "is_test_cell",
    "lab_source_from_notebook",
    "parse_notebook",
    "grade_cell_for",
    "grade_id_for",
]

TEST_CELL_MARKER = "# attention-labs: autograder test cell"
# The generated notebooks' cell for trying things: nothing in it is graded, definitions
# included (so a lab 2 student may paste their lab 1 function there to run lab 2 code).
SCRATCH_CELL_MARKER = "# attention-labs: scratch cell"
HIDDEN_TESTS_GRADE_ID = "hidden_tests"   # the one test cell of a lab's hidden tests
MAX_NOTEBOOK_BYTES = 32 << 20   # a notebook with plots can be large; its code is capped below
MAX_SOURCE_BYTES = 1 << 20      # the extracted code, like grading.MAX_FILE_BYTES for a .py
# Caps on the code cells, checked before anything is parsed or compiled (a notebook is
# untrusted input, and parsing hostile code costs time and memory out of all proportion).
MAX_CODE_CELLS = 1000
MAX_LINE_CHARS = 10_000
MAX_NESTING = 100               # brackets open at once, or names in one dotted chain
_DOTTED_CHAIN_RE = re.compile(r"(?:\.\s*[A-Za-z_]\w*\s*){%d}" % MAX_NESTING)

LAB_MODULE_RE = re.compile(r"lab\d+_\w+$")   # a lab module's name (lab1_attention)
_CELL_MAGIC_RE = re.compile(r"\s*%%(\w+)")
_PY_BODY_CELL_MAGICS = {"time", "capture"}          # their body runs as ordinary Python code
_MAGIC_LINE_RE = re.compile(r"(\s*)(?:[%!]|[\w.,\s]+=\s*[%!])")
_HELP_LINE_RE = re.compile(r"\s*(?:\?\??[\w.]+|[\w.]+\?\??)\s*$")
_NOTE_LIST = 10                 # at most this many places are listed in one note


@dataclass
class Cell:
    label: str            # how messages name it: "code cell 3", "In[12]"
    source: str
    test: bool = False    # an autograder test cell (left out)


@dataclass
class Extracted:
    source: str                                         # the lab's .py text
    notes: list[str] = field(default_factory=list)      # what was left out, and the line map
    cells: list[str] = field(default_factory=list)      # labels of the cells whose code is used


# --------------------------------------------------------------------------------------
# Grade ids shared by the notebook builder, the in-kernel test cells and the gradebook export
# --------------------------------------------------------------------------------------


def hidden_test_id(lab: str, test: str) -> str:
    """An opaque, stable id for a hidden test: released notebooks, nbgrader feedback and
    tracebacks show it instead of the test's name."""
    return hashlib.sha256(f"{lab}/{test}".encode()).hexdigest()[:10]


def grade_id_for(lab: str, test: str, visibility: str) -> str:
    """The id of one rubric test in a notebook: the nbgrader ``grade_id`` of a public test's
    cell (``public_<name>``); for a hidden test ``hidden_<opaque id>``, which named its own
    cell in notebooks built before the hidden tests shared one (HIDDEN_TESTS_GRADE_ID)."""
    if visibility == "hidden":
        return f"hidden_{hidden_test_id(lab, test)}"
    return f"public_{test}"


def grade_cell_for(lab: str, test: str, visibility: str) -> str:
    """The nbgrader grade cell that scores one rubric test: a public test's own cell, or the
    one cell of all the lab's hidden tests (worth their points together)."""
    return HIDDEN_TESTS_GRADE_ID if visibility == "hidden" else grade_id_for(lab, test, visibility)


# --------------------------------------------------------------------------------------
# Reading notebooks
# --------------------------------------------------------------------------------------


def _text(value) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "".join(value)
    return None


_CHECK_RE = re.compile(r"\bgrader\.notebooks\b[^\n]*\bcheck\b|\bgrader\.notebooks\.check\b")


def is_test_cell(source: str, metadata: object = None) -> bool:
    """An autograder test cell: nbgrader "Autograder tests" metadata, our marker, or a use
    of ``grader.notebooks.check`` (a test cell a student copied); also the scratch cell
    (:data:`SCRATCH_CELL_MARKER`), which is never graded either. The lab-import fallback
    of a given cell (``grader.notebooks.provided_when_graded``) is not one."""
    nb = metadata.get("nbgrader") if isinstance(metadata, dict) else None
    if isinstance(nb, dict) and nb.get("grade") is True and not nb.get("solution"):
        return True
    return (TEST_CELL_MARKER in source or SCRATCH_CELL_MARKER in source
            or bool(_CHECK_RE.search(source)))


def parse_notebook(data: bytes, *, name: str) -> list[Cell]:
    """The code cells of notebook *data* (file *name*, for messages), nbformat 4 or 3."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise NotebookError(f"{name} is not a valid notebook: not UTF-8 text "
                            f"(byte 0x{data[exc.start]:02x} at line {line})") from None
    if not text.strip():
        raise NotebookError(f"{name} is empty")
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotebookError(f"{name} is not a valid notebook: {exc.msg} at line {exc.lineno}, "
                            f"column {exc.colno} (it is not JSON; was it saved by Jupyter?)") from None
    except RecursionError:
        raise NotebookError(f"{name} is not a valid notebook: nested too deeply") from None
    if not isinstance(nb, dict):
        raise NotebookError(f"{name} is not a valid notebook: expected a JSON object with a "
                            f"list of cells, got a JSON {type(nb).__name__}")
    raw_cells = nb.get("cells")
    input_key = "source"
    if raw_cells is None and isinstance(nb.get("worksheets"), list):       # nbformat 3
        raw_cells = [c for ws in nb["worksheets"] if isinstance(ws, dict)
                     for c in (ws.get("cells") or [])]
        input_key = "input"
    if not isinstance(raw_cells, list):
        raise NotebookError(f"{name} is not a valid notebook: it has no list of cells")
    cells: list[Cell] = []
    n_code = 0
    for raw in raw_cells:
        if not isinstance(raw, dict) or raw.get("cell_type") != "code":
            continue
        n_code += 1
        if n_code > MAX_CODE_CELLS:
            raise NotebookError(f"{name} has more than {MAX_CODE_CELLS} code cells")
        source = _text(raw.get(input_key, raw.get("source", "")))
        if source is None:
            continue  # a malformed cell holds no code we could read
        cells.append(Cell(label=f"code cell {n_code}", source=source,
                          test=is_test_cell(source, raw.get("metadata"))))
    check_cells(cells, name=name)
    return cells


def check_cells(cells: list[Cell], *, name: str) -> None:
    """The caps on code, before any of it is parsed: NotebookError naming the cell, line
    and cap (total size, line length, brackets or dotted names nested too deeply)."""
    total = 0
    for cell in cells:
        total += len(cell.source)
        if total > 2 * MAX_SOURCE_BYTES:
            raise NotebookError(f"{name}: its code cells hold more than "
                                f"{2 * MAX_SOURCE_BYTES >> 20} MiB of text")
        for number, line in enumerate(cell.source.split("\n"), 1):
            if len(line) > MAX_LINE_CHARS:
                raise NotebookError(f"{name}, {cell.label}, line {number}: a line of "
                                    f"{len(line)} characters; the limit is {MAX_LINE_CHARS}")
            if _DOTTED_CHAIN_RE.search(line):
                raise NotebookError(f"{name}, {cell.label}, line {number}: a chain of more "
                                    f"than {MAX_NESTING} dotted names")
        if _bracket_depth(cell.source) > MAX_NESTING:
            raise NotebookError(f"{name}, {cell.label}: brackets nested more than "
                                f"{MAX_NESTING} deep")


def _bracket_depth(text: str) -> int:
    """The most brackets open at once in ``text`` (strings not told apart: an upper bound)."""
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth = max(0, depth - 1)
    return deepest


def read_regular_file(path: Path, max_bytes: int, *, hint: str = "") -> bytes:
    """A regular file (no link followed at the last component) of at most ``max_bytes``.

    ValueError says what is wrong ("is not a regular file", "is 3.1 MiB; the limit is 1
    MiB" plus ``hint``); a file that grows while read is caught on the bytes read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("is not a regular file")
        if st.st_size > max_bytes:
            raise ValueError(f"is {st.st_size / 2**20:.1f} MiB; the limit is "
                             f"{max_bytes >> 20} MiB{hint}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ValueError(f"is larger than {max_bytes >> 20} MiB")
        return data
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------
# Cleaning one cell
# --------------------------------------------------------------------------------------


def _strip_ipython(source: str) -> tuple[str, bool]:
    """Magic, shell and help lines replaced by ``pass`` at their indentation (so blocks stay
    valid and line numbers stay put); whether any was replaced."""
    out, changed = [], False
    for line in source.split("\n"):
        m = _MAGIC_LINE_RE.match(line)
        if m or _HELP_LINE_RE.match(line):
            indent = m.group(1) if m else line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}pass")
            changed = True
        else:
            out.append(line)
    return "\n".join(out), changed


def _syntax_note(label: str, exc: SyntaxError, source: str) -> str:
    line = exc.lineno or 1
    lines = source.split("\n")
    text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    shown = f" (`{text[:60]}`)" if text else ""
    return f"{label} was left out: {exc.msg} at its line {line}{shown}"


def _clean_cell(cell: Cell, notes: list[str], flags: set[str]) -> tuple[str, ast.Module] | None:
    """The cell's code and its tree, or None (left out, with a note where it matters)."""
    source = cell.source.replace("\r\n", "\n").replace("\r", "\n")
    if not source.strip():
        return None
    first = source.lstrip("\n").split("\n", 1)[0]
    m = _CELL_MAGIC_RE.match(first)
    if m:
        if m.group(1) not in _PY_BODY_CELL_MAGICS:
            notes.append(f"{cell.label} was left out: it runs the cell magic %%{m.group(1)}")
            return None
        lines = source.split("\n")
        idx = next(i for i, ln in enumerate(lines) if ln.strip())
        lines[idx] = ""
        source = "\n".join(lines)
        flags.add("magic")
    try:
        return source, ast.parse(source)
    except SyntaxError:
        pass
    except (ValueError, RecursionError, MemoryError) as exc:
        notes.append(f"{cell.label} was left out: it cannot be parsed ({type(exc).__name__})")
        return None
    stripped, changed = _strip_ipython(source)
    try:
        tree = ast.parse(stripped)
    except SyntaxError as exc:
        notes.append(_syntax_note(cell.label, exc, stripped))
        return None
    except (ValueError, RecursionError, MemoryError) as exc:
        notes.append(f"{cell.label} was left out: it cannot be parsed ({type(exc).__name__})")
        return None
    if changed:
        flags.add("magic")
    return stripped, tree


# --------------------------------------------------------------------------------------
# Keeping definitions, leaving out experiments
# --------------------------------------------------------------------------------------

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _bound_names(stmt: ast.stmt) -> set[str]:
    """Top-level names a statement binds (not inside nested functions or classes)."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, _DEFS):
            names.add(node.name)
            return
        if isinstance(node, ast.Lambda):
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name != "*":
                    names.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(stmt)
    return names


def _runtime_nodes(stmt: ast.stmt):
    """The nodes of *stmt* that run when it runs (not the bodies of functions and lambdas
    defined in it; class bodies do run)."""
    stack = [stmt]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                stack.extend(child.decorator_list)
                stack.extend(d for d in child.args.defaults + child.args.kw_defaults if d)
            elif isinstance(child, ast.Lambda):
                stack.extend(d for d in child.args.defaults + child.args.kw_defaults if d)
            else:
                stack.append(child)


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _module_available(name: str) -> bool:
    top = name.split(".")[0]
    if LAB_MODULE_RE.match(top) or top == "__future__":
        return True
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def _why_left_out(stmt: ast.stmt, own: set[str], tainted: set[str],
                  forbidden_leaves: set[str]) -> str | None:
    """Why a top-level statement is not graded, or None to keep it."""
    if isinstance(stmt, _DEFS):
        return None
    if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
        return "a __future__ import"
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        mods = ([a.name for a in stmt.names] if isinstance(stmt, ast.Import)
                else [stmt.module or ""] if stmt.level == 0 else [])
        missing = [m for m in mods if m and not _module_available(m)]
        if missing:
            return f"imports {missing[0]}, which the grader does not have"
        return None
    if isinstance(stmt, ast.Expr):
        return "an expression (output)"
    if isinstance(stmt, ast.Assert):
        return "an assert (a check of your own)"
    for node in _runtime_nodes(stmt):
        if isinstance(node, ast.Attribute) and node.attr in forbidden_leaves:
            return f"uses {node.attr}, which the lab may not use"
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in tainted:
            return f"uses {node.id}, the result of a statement left out"
        if isinstance(node, ast.Call) and _root_name(node.func) in own:
            return "runs your code"
    return None


def _filter_cell(tree: ast.Module, source: str, label: str, own: set[str], tainted: set[str],
                 forbidden_leaves: set[str], dropped: list[str]) -> str:
    """The cell with its left-out top-level statements taken out.

    One rule, statement by statement, however the statements are laid out: a left-out
    statement's text is blanked (its lines stay, so line numbers do not move). Where it
    shares a line with a kept statement (``q = ...; out = f(q); print(out)``), it becomes
    ``pass`` in place, so the line still parses and nothing left out runs.
    """
    data = bytearray(source.encode("utf-8"))        # ast offsets are UTF-8 byte offsets
    line_starts = [0]
    for i, byte in enumerate(data):
        if byte == 0x0A:
            line_starts.append(i + 1)

    def offset(line: int, col: int) -> int:
        return line_starts[line - 1] + col

    kept_lines: set[int] = set()
    left_out: list[ast.stmt] = []
    for stmt in tree.body:
        why = _why_left_out(stmt, own, tainted, forbidden_leaves)
        start = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        end = stmt.end_lineno or stmt.lineno
        bound = _bound_names(stmt)
        if why is None:
            tainted.difference_update(bound)
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None and any(
                    isinstance(n, ast.Name) and n.id in own for n in ast.walk(stmt.value)):
                own.update(bound)            # an alias of a notebook function or class
            kept_lines.update(range(start, end + 1))
        else:
            tainted.update(bound)
            dropped.append(f"{label} line {stmt.lineno} ({why})")
            left_out.append(stmt)
    # Last first: a widened "pass" must not move the offsets of what is still to do.
    for stmt in reversed(left_out):
        start = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        end = stmt.end_lineno or stmt.lineno
        shared = start in kept_lines or end in kept_lines
        if shared:
            # Shares a line with a kept statement (only simple statements can): exactly
            # its own text goes.
            lo = offset(stmt.lineno, stmt.col_offset)
            hi = offset(end, stmt.end_col_offset or 0)
        else:
            lo = offset(start, 0)
            hi = line_starts[end] - 1 if end < len(line_starts) else len(data)
        for i in range(lo, hi):
            if data[i] != 0x0A:
                data[i] = 0x20
        if shared:
            # "pass" in its place, where the kept statement beside it needs it: on its last
            # line when something follows it there ("pass; z = 3"), else where it began.
            at = max(lo, line_starts[end - 1]) if end in kept_lines and offset(
                end, stmt.end_col_offset or 0) < _line_end(data, line_starts, end) else lo
            width = hi - at
            data[at:at + min(width, 4)] = b"pass"
    lines = data.decode("utf-8").split("\n")
    return "\n".join(text if text.strip() else "" for text in lines)


def _line_end(data: bytearray, line_starts: list[int], line: int) -> int:
    """The offset of the last non-blank byte of ``line`` (1-based) plus one."""
    end = line_starts[line] - 1 if line < len(line_starts) else len(data)
    while end > line_starts[line - 1] and data[end - 1] in b" \t\r":
        end -= 1
    return end


def _places(items: list[str]) -> str:
    shown = "; ".join(items[:_NOTE_LIST])
    return shown + (f"; and {len(items) - _NOTE_LIST} more" if len(items) > _NOTE_LIST else "")


# --------------------------------------------------------------------------------------
# The lab's source
# --------------------------------------------------------------------------------------


def given_imports(lab_file: str, solutions_dir: str | Path | None = None) -> str:
    """The top-level imports of the lab's reference file (``solutions/<lab_file>``), except
    imports of other labs, as one line; "" when that file is not there."""
    if solutions_dir is None:           # no course solutions at hand: no given imports
        return ""
    try:
        tree = ast.parse(Path(solutions_dir, lab_file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return ""
    parts = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            names = [a for a in stmt.names if not LAB_MODULE_RE.match(a.name.split(".")[0])]
            parts += [f"import {a.name}" + (f" as {a.asname}" if a.asname else "") for a in names]
        elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module \
                and not LAB_MODULE_RE.match(stmt.module.split(".")[0]) and stmt.module != "__future__":
            names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in stmt.names)
            parts.append(f"from {stmt.module} import {names}")
    return "; ".join(parts)


def extract_lab_source(cells: list[Cell], *, name: str, prelude: str = "",
                       forbidden: tuple[str, ...] | list[str] = ()) -> Extracted:
    """The ``.py`` text for the code *cells* (of notebook *name*), see the module docstring.

    *prelude* (one line, e.g. :func:`given_imports`) goes first; *forbidden* are the dotted
    names the lab may not use (top-level statements naming them are left out, so that a
    comparison with PyTorch in a scratch cell does not disqualify the lab).
    NotebookError when no code is left or the result is not valid Python."""
    check_cells(cells, name=name)
    try:
        return _extract(cells, name=name, prelude=prelude, forbidden=forbidden)
    except (RecursionError, MemoryError) as exc:
        raise NotebookError(f"{name}: its code cannot be read ({type(exc).__name__}: nested "
                            "too deeply, or too large)") from None


def _extract(cells: list[Cell], *, name: str, prelude: str,
             forbidden: tuple[str, ...] | list[str]) -> Extracted:
    notes: list[str] = []
    flags: set[str] = set()
    cleaned: list[tuple[Cell, str, ast.Module]] = []
    n_tests = 0
    for cell in cells:
        if cell.test:
            n_tests += 1
            continue
        got = _clean_cell(cell, notes, flags)
        if got is not None:
            cleaned.append((cell, got[0], got[1]))
    if not cleaned:
        why = " (only autograder test cells)" if n_tests else ""
        raise NotebookError(f"{name} has no code to grade{why}")

    own: set[str] = set()
    for _, _, tree in cleaned:
        own.update(s.name for s in tree.body if isinstance(s, _DEFS))
    tainted: set[str] = set()
    leaves = {f.rsplit(".", 1)[-1] for f in forbidden}
    dropped: list[str] = []

    out_lines: list[str] = []
    spans: list[str] = []
    if prelude:
        out_lines.append(f"{prelude}  # the lab's given imports, added by the grader")
    for cell, source, tree in cleaned:
        text = _filter_cell(tree, source, cell.label, own, tainted, leaves, dropped)
        out_lines.append(f"# ---- {name}, {cell.label} ----")
        first = len(out_lines) + 1
        body = text.split("\n")
        out_lines.extend(body)
        spans.append(f"{cell.label} = lines {first}-{first + len(body) - 1}")
    source = "\n".join(out_lines).rstrip("\n") + "\n"

    try:
        compile(source, name, "exec", dont_inherit=True)
    except SyntaxError as exc:
        line = exc.lineno or 1
        where = next((s for s in spans if _in_span(s, line)), None)
        detail = f", {where.split(' = ')[0]}" if where else ""
        raise NotebookError(f"{name}{detail}: the code of the notebook is not valid Python: "
                            f"{exc.msg} (line {line} of the code built from it)") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise NotebookError(f"{name}: the code of the notebook cannot be compiled "
                            f"({type(exc).__name__})") from None
    if len(source.encode("utf-8")) > MAX_SOURCE_BYTES:
        raise NotebookError(f"{name}: its code is larger than {MAX_SOURCE_BYTES >> 20} MiB")

    if "magic" in flags:
        notes.append(f"{name}: IPython magics, shell commands (%, !) and help lines (?) were left out")
    if dropped:
        notes.append(f"{name}: only definitions are graded; left out: {_places(dropped)}")
    notes.append(f"{name}: graded as one file built from its code cells"
                 + (" after the given imports (line 1)" if prelude else "")
                 + f"; line numbers in messages: {_places(spans)}")
    return Extracted(source=source, notes=notes, cells=[c.label for c, _, _ in cleaned])


def _in_span(span: str, line: int) -> bool:
    m = re.search(r"lines (\d+)-(\d+)$", span)
    return bool(m) and int(m.group(1)) <= line <= int(m.group(2))


def lab_source_from_notebook(path: Path, *, rel: str | Path, lab_file: str,
                             forbidden: tuple[str, ...] | list[str] = (),
                             solutions_dir: str | Path | None = None) -> Extracted:
    """What ``grading.sanitize`` calls for a submitted ``labN_x.ipynb`` (*rel*: its path inside
    the submission, for messages); NotebookError says what is wrong."""
    rel = str(rel)
    try:
        data = read_regular_file(path, MAX_NOTEBOOK_BYTES, hint=" for a notebook (clear its outputs)")
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise NotebookError(f"{rel} {reason}") from None
    # A notebook edited in a Windows editor: its cp1252 read as the sanitizer reads a .py's
    # (grader.intake.encoding); anything else not UTF-8 is parse_notebook's to refuse.
    try:
        converted = to_utf8(data)
    except NotUTF8:
        converted = None
    cells = parse_notebook(converted.data if converted else data, name=rel)
    got = extract_lab_source(cells, name=rel, prelude=given_imports(lab_file, solutions_dir),
                             forbidden=forbidden)
    if converted and converted.note:
        got.notes.insert(0, f"{rel} {converted.note}")
    return got
