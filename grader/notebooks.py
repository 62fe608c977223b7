"""nbgrader notebooks for the labs, generated from ``solutions/`` and ``rubric.yaml``.

``grader notebooks --out COURSE`` writes an nbgrader course folder (docs/notebooks.md):

    COURSE/nbgrader_config.py
    COURSE/source/<lab>/<lab>.ipynb        one nbgrader assignment per lab, e.g. lab1_attention

Each notebook holds the lab's lesson (the module docstring) as markdown, its code split into
cells (given code read-only, code with solution regions as nbgrader solution cells, the regions
marked ``### BEGIN SOLUTION`` / ``### END SOLUTION``), and one autograder test cell per rubric
test, worth the rubric's points. A test cell does not test anything itself: it calls
:func:`check`, which hands the code this kernel has run to the grader in a separate process
(the same sandboxed engine as ``grader grade``) and turns the result of that one test into a
pass (no output on stderr) or a failure (an error output whose text is the grader's message).
Hidden tests sit in ``### BEGIN HIDDEN TESTS`` regions and name their test only by an opaque
id, so neither released notebooks, nor feedback, nor tracebacks show them.

This module is imported inside students' kernels (by the test cells): keep its top level light.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from grader.notebook_source import TEST_CELL_MARKER, hidden_test_id, grade_id_for

__all__ = ["GraderUnavailable", "TestFailed", "check", "course_drift", "course_files",
           "generate_assignments", "private_jupyter_env", "register", "write_course"]

KERNEL_GRADE_TIMEOUT_S = 900
_LAB_RE = re.compile(r"lab\d+_\w+")
_CACHE: dict[str, dict] = {}
_MAX_SHOWN = 4000


# ======================================================================================
# In the kernel: the test cells
# ======================================================================================


class TestFailed(AssertionError):
    """A test failed. IPython shows only this text (no traceback with the cell's source)."""

    __test__ = False

    def __init__(self, headline: str, message: str = ""):
        self.headline, self.message = headline, message
        super().__init__(headline + (f"\n{message}" if message else ""))

    def _render_traceback_(self) -> list[str]:
        return [self.headline] + (self.message.splitlines() if self.message else [])


class GraderUnavailable(TestFailed):
    """The grader itself could not run; the test counts as failed."""


def _kernel_cells() -> list[dict]:
    try:
        from IPython import get_ipython
    except ImportError:
        get_ipython = None
    ip = get_ipython() if get_ipython else None
    if ip is None or not hasattr(ip, "history_manager"):
        raise GraderUnavailable("check() grades the cells this Jupyter kernel has run; "
                                "call it from a notebook (or use `grader check` on a folder)")
    from grader.notebook_source import is_test_cell

    raw = list(ip.history_manager.input_hist_raw)
    # Test cells are left out here already, so that running one more of them does not
    # change the code, and the result of the first is reused.
    return [{"label": f"In[{i}]", "source": src} for i, src in enumerate(raw)
            if i > 0 and isinstance(src, str) and src.strip() and not is_test_cell(src)]


def _kernel_dependencies(lab: str) -> dict[str, str]:
    """Other lab modules this kernel imported from files (lab2 imports lab1_attention)."""
    deps = {}
    for name, module in list(sys.modules.items()):
        if name == lab or not _LAB_RE.fullmatch(name):
            continue
        path = getattr(module, "__file__", None)
        if path and path.endswith(".py") and os.path.isfile(path):
            try:
                deps[f"{name}.py"] = Path(path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                pass
    return deps


def _run_grader(request: dict) -> dict:
    """Grade in a fresh process: ``python -m grader.notebooks --kernel-grade`` (JSON in, JSON
    out), run from an empty folder so that nothing next to the notebook shadows a package."""
    with tempfile.TemporaryDirectory(prefix="grader-nb-") as cwd:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "grader.notebooks", "--kernel-grade"],
                input=json.dumps(request).encode(), capture_output=True, cwd=cwd,
                timeout=KERNEL_GRADE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise GraderUnavailable(f"the grader did not finish within {KERNEL_GRADE_TIMEOUT_S} s") from None
        except OSError as exc:
            raise GraderUnavailable(f"the grader could not be started: {exc}") from None
    lines = proc.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        reply = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-15:]
        raise GraderUnavailable(f"the grader failed (exit status {proc.returncode})",
                                "\n".join(tail)) from None
    if not reply.get("ok"):
        raise GraderUnavailable("the grader could not grade this notebook", reply.get("error", ""))
    return reply


def check(lab: str, test: str | None = None, *, hidden: str | None = None) -> None:
    """Run rubric test *test* (public) or the hidden test with id *hidden* of *lab* on the code
    this kernel has run, in the grader's sandbox; raise :class:`TestFailed` unless it passed.

    The whole lab is graded once per version of the code (later test cells reuse the result).
    Nothing is written to stderr, so a warning printed by a library cannot cost the points."""
    import contextlib
    import io
    import warnings

    if (test is None) == (hidden is None):
        raise GraderUnavailable("check() needs a test name or hidden=<id>")
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        request = {"lab": lab, "cells": _kernel_cells(), "deps": _kernel_dependencies(lab)}
        key = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        reply = _CACHE.get(key)
        if reply is None:
            reply = _run_grader(request)
            _CACHE.clear()                      # keep one version per kernel
            _CACHE[key] = reply
    kind = "hidden" if hidden is not None else "public"
    outcome = reply.get(kind, {}).get(hidden if hidden is not None else test)
    what = "hidden test" if hidden is not None else test
    if outcome is None:
        raise GraderUnavailable(f"{lab} has no {kind} test {what!r} in the grader's rubric "
                                "(is this notebook older than the course's rubric?)")
    points = outcome["points"]
    if outcome["passed"]:
        print(f"passed: {what} ({points:g} point{'s' if points != 1 else ''})")
        return
    message = outcome.get("message", "")[:_MAX_SHOWN]
    notes = reply.get("notes", [])
    if notes:
        message += "\n" + "\n".join(f"Note: {n}" for n in notes)
    raise TestFailed(f"FAILED: {what} (0 of {points:g} point{'s' if points != 1 else ''})", message)


def _kernel_grade(request: dict) -> dict:
    """The trusted side of :func:`check` (runs in the subprocess)."""
    from grader import paths
    from grader.grading import grade_submission
    from grader.notebook_source import Cell, NotebookError, extract_lab_source, given_imports, is_test_cell
    from grader.rubric import load_rubric

    rubric = load_rubric(paths.RUBRIC)
    lab = request.get("lab")
    if lab not in rubric.labs:
        return {"ok": False, "error": f"unknown lab {lab!r}; the labs are {', '.join(rubric.labs)}"}
    spec = rubric.labs[lab]
    visibility = ("public", "hidden") if (paths.SUITES / "hidden" / f"test_{lab}.py").is_file() \
        else ("public",)
    cells = [Cell(label=str(c["label"]), source=str(c["source"]), test=is_test_cell(str(c["source"])))
             for c in request.get("cells", [])]
    reply: dict = {"ok": True, "public": {}, "hidden": {}, "notes": []}

    def record(name, t_visibility, points, passed, message):
        key = hidden_test_id(lab, name) if t_visibility == "hidden" else name
        reply[t_visibility][key] = {"points": points, "passed": passed, "message": message}

    try:
        got = extract_lab_source(cells, name=f"{lab} (this notebook)",
                                 prelude=given_imports(spec.file), forbidden=spec.forbidden)
    except NotebookError as exc:
        for name, t in spec.tests.items():
            record(name, t.visibility, t.points, False, str(exc))
        return reply
    reply["notes"] = got.notes
    with tempfile.TemporaryDirectory(prefix="grader-nb-") as tmp:
        Path(tmp, spec.file).write_text(got.source, encoding="utf-8")
        for file, text in (request.get("deps") or {}).items():
            other = rubric.lab_for_file(str(file))
            if other is not None and other.name != lab:     # reaches the sandbox, not graded
                Path(tmp, other.file).write_text(str(text), encoding="utf-8")
        result = grade_submission(tmp, rubric=rubric, labs=[lab], visibility=visibility, name=lab)
    for t in result.lab(lab).tests:
        record(t.name, t.visibility, t.max_score, t.passed, t.message)
    return reply


def _kernel_grade_main() -> int:
    try:
        request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
        reply = _kernel_grade(request)
    except Exception as exc:  # the kernel shows this as the reason the test could not run
        reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write("\n" + json.dumps(reply) + "\n")
    return 0


# ======================================================================================
# Building the course
# ======================================================================================

CONFIG_FILE = "nbgrader_config.py"

NBGRADER_CONFIG = r'''# Generated by `grader notebooks` (attention-labs); regenerate rather than edit.
# nbgrader configuration for the lab notebooks in source/ (one assignment per lab).
c = get_config()  # noqa: F821

c.CourseDirectory.course_id = "attention-labs"

# Test cells grade the whole lab in a separate process the first time they run (~10-30 s).
c.Execute.timeout = 600

# nbgrader gives 0 points to a test cell with any output on stderr (nbgrader PR #1904).
# Our test cells write nothing there; should a library still print a warning into one
# (a PyTorch UserWarning and the source line Python shows under it), drop that output
# instead of the points. Output with anything else on stderr is kept and still counts.
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = r"\A(?:[^ \t\n](?:(?!Warning\b)[^\n])*Warning\b[^\n]*(?:\n|\Z)(?:[ \t][^\n]*(?:\n|\Z))*)+\Z"

# Feedback shows the autograded notebook: strip the hidden test regions (nbgrader #917).
# (They only name opaque test ids, and hidden failures print no values, in any case.)
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbgrader.preprocessors.ClearHiddenTests",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]

# A deleted test cell is put back by autograde instead of breaking it (nbgrader #1682, #1941).
c.OverwriteCells.add_missing_cells = True
'''

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def _md(cell_id: str, text: str) -> dict:
    return {"cell_type": "markdown", "id": cell_id, "metadata": {}, "source": _source_lines(text)}


def _code(cell_id: str, text: str, nbgrader: dict) -> dict:
    meta = dict(nbgrader)
    meta["schema_version"] = 3
    return {"cell_type": "code", "execution_count": None, "id": cell_id,
            "metadata": {"nbgrader": meta}, "outputs": [], "source": _source_lines(text)}


def _source_lines(text: str) -> list[str]:
    return text.strip("\n").splitlines(keepends=True)


def _cell_id(grade_id: str) -> str:
    cid = re.sub(r"[^A-Za-z0-9_-]", "-", grade_id)
    return cid if len(cid) <= 64 else cid[:53] + "-" + hashlib.sha256(cid.encode()).hexdigest()[:10]


def _docstrings(suite: Path) -> dict[str, str]:
    """test name -> first line of its docstring, for the public test cells."""
    import ast
    try:
        tree = ast.parse(suite.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return {}
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            doc = (ast.get_docstring(node) or "").strip()
            found[node.name] = " ".join(doc.split("\n\n")[0].split())
    return found


def _chunks(source: str, tree, lines: list[str]) -> list[tuple[int, int, str, str]]:
    """Top-level statements grouped into cells: (first line, last line, kind, name);
    imports together, each def/class alone, other statements together. Comments and blank
    lines before a statement belong to it."""
    import ast
    body = list(tree.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
        prev_end = tree.body[0].end_lineno
    else:
        prev_end = 0
    chunks: list[list] = []
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            kind, name = "imports", "imports"
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            kind, name = "def", stmt.name
        else:
            kind, name = "code", "code"
        end = stmt.end_lineno
        # Indented lines after a block (a trailing "# END SOLUTION") still belong to it.
        n = end
        while n < len(lines) and (not lines[n].strip() or lines[n][:1] in (" ", "\t")):
            n += 1
        while n > end and not lines[n - 1].strip():
            n -= 1
        end = n
        if chunks and kind != "def" and chunks[-1][2] == kind:
            chunks[-1][1] = end
        else:
            chunks.append([prev_end + 1, end, kind, name])
        prev_end = end
    if chunks:
        chunks[-1][1] = len(lines)
    return [tuple(c) for c in chunks]


def _cell_text(lines: list[str], first: int, last: int, regions) -> str:
    """Lines first..last (1-based) with solution regions in nbgrader's markers; the region's
    ``# hint:`` lines become ``# TODO(Lab N):`` lines just above it (kept in the student
    version, where nbgrader puts ``raise NotImplementedError()`` in place of the region)."""
    out: list[str] = []
    skip: set[int] = set()
    starts = {r.start_line: r for r in regions}
    ends = {r.end_line: r for r in regions}
    for r in regions:
        skip.update(range(r.start_line + 1, r.start_line + 1 + len(r.hints)))
    for n in range(first, last + 1):
        if n in skip:
            continue
        if n in starts:
            r = starts[n]
            todo = list(r.hints) or [f"implement {r.func_name}."]
            out += [f"{r.indent}# TODO(Lab {r.lab}): {h}".rstrip() for h in todo]
            out.append(f"{r.indent}### BEGIN SOLUTION")
        elif n in ends:
            out.append(f"{ends[n].indent}### END SOLUTION")
        else:
            out.append(lines[n - 1])
    return "\n".join(out).strip("\n")


def _lab_imports(tree) -> list[str]:
    import ast
    mods = []
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module and _LAB_RE.fullmatch(stmt.module.split(".")[0]):
            mods.append(stmt.module.split(".")[0])
        elif isinstance(stmt, ast.Import):
            mods += [a.name.split(".")[0] for a in stmt.names if _LAB_RE.fullmatch(a.name.split(".")[0])]
    return sorted(set(mods))


def build_notebook(lab: str, *, rubric, solutions_dir: Path, suites_dir: Path,
                   dependencies_included: bool = False) -> dict:
    """The nbgrader source notebook of *lab* (a JSON-ready dict)."""
    import ast

    from grader.stubs import StubError, solution_regions

    spec = rubric.labs[lab]
    path = Path(solutions_dir) / spec.file
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise StubError(f"{path}:1: cannot read: {exc}") from None
    regions = solution_regions(source, path=str(path))        # validates the markers
    tree = ast.parse(source, filename=str(path))
    lines = source.splitlines()
    for r in regions:
        for text in r.code_lines:
            if "BEGIN HIDDEN TESTS" in text or "END HIDDEN TESTS" in text:
                raise StubError(f"{path}:{r.start_line}: a solution may not contain nbgrader's "
                                "hidden-test markers")
    lab_no = int(re.match(r"lab(\d+)_", lab).group(1))

    doc = (ast.get_docstring(tree, clean=True) or "").strip()
    doc_lines = doc.splitlines()
    if doc_lines and re.match(rf"\s*Lab {lab_no}\b", doc_lines[0]):
        doc = "\n".join(doc_lines[1:]).strip()
    cells = [_md("lesson", f"# Lab {lab_no}: {spec.title}\n\n{doc}")]

    how = [
        "## How this notebook works",
        "",
        "- Write your code where a cell says `raise NotImplementedError()`; the `# TODO` comments "
        "above it say what to do. Keep the given code, names and signatures: the tests call them "
        "(`docs/LAB_CONTRACT.md`).",
        "- Add cells of your own to try things out. Grading uses your definitions (imports, "
        "functions, classes, constants) and leaves out experiments: prints, checks and calls "
        "of your own code at the top level of a cell.",
        "- The test cells at the end run the course's tests on the code this notebook has run, in "
        "a separate, isolated process (the `grader` package must be installed where this kernel "
        "runs). Use **Kernel > Restart & Run All** before you trust them. Hidden tests run only "
        "when your notebook is graded.",
    ]
    deps = _lab_imports(tree)
    if deps and not dependencies_included:
        files = ", ".join(f"`{d}.py`" for d in deps)
        how.append(f"- This lab imports your earlier work: put your {files} in the same folder "
                   "as this notebook.")
    cells.append(_md("how-it-works", "\n".join(how)))

    used_ids: set[str] = set()

    def unique(grade_id: str) -> str:
        base, n = grade_id, 2
        while grade_id in used_ids:
            grade_id, n = f"{base}_{n}", n + 1
        used_ids.add(grade_id)
        return grade_id

    for first, last, kind, name in _chunks(source, tree, lines):
        inside = [r for r in regions if first <= r.start_line <= last]
        text = _cell_text(lines, first, last, inside)
        if not text.strip():
            continue
        if inside:
            gid = unique(f"solution_{name}")
            cells.append(_code(_cell_id(gid), text, {"grade": False, "solution": True,
                                                     "locked": False, "grade_id": gid}))
        else:
            gid = unique(f"given_{name}")
            cells.append(_code(_cell_id(gid), text, {"grade": False, "solution": False,
                                                     "locked": True, "grade_id": gid}))

    public = [(n, t) for n, t in spec.tests.items() if t.visibility == "public"]
    hidden = [(n, t) for n, t in spec.tests.items() if t.visibility == "hidden"]
    total = sum(t.points for t in spec.tests.values())
    cells.append(_md("autograder-tests", "\n".join([
        "## Autograder tests",
        "",
        f"One cell per test of the course rubric, {total:g} points in all: {len(public)} public "
        f"tests you can run now and {len(hidden)} hidden tests that run when your notebook is "
        "graded. Do not edit or delete these cells (autograding restores them). A failing test "
        "prints why; hidden tests say what went wrong but never show expected values.",
    ])))
    described = _docstrings(Path(suites_dir) / "public" / f"test_{lab}.py")
    for name, t in public:
        gid = unique(grade_id_for(lab, name, "public"))
        what = described.get(name, "")
        text = "\n".join([
            TEST_CELL_MARKER,
            f"# {name} ({t.points:g} point{'s' if t.points != 1 else ''})"
            + (f": {what}" if what else ""),
            "from grader.notebooks import check",
            f"check({lab!r}, {name!r})",
        ])
        cells.append(_code(_cell_id(gid), text, {"grade": True, "solution": False, "locked": True,
                                                 "points": t.points, "grade_id": gid}))
    for i, (name, t) in enumerate(hidden, start=1):
        gid = unique(grade_id_for(lab, name, "hidden"))
        text = "\n".join([
            TEST_CELL_MARKER,
            f"# Hidden test {i} of {len(hidden)} ({t.points:g} point{'s' if t.points != 1 else ''}): "
            "it runs when your notebook is graded.",
            "### BEGIN HIDDEN TESTS",
            "from grader.notebooks import check",
            f"check({lab!r}, hidden={hidden_test_id(lab, name)!r})",
            "### END HIDDEN TESTS",
        ])
        cells.append(_code(_cell_id(gid), text, {"grade": True, "solution": False, "locked": True,
                                                 "points": t.points, "grade_id": gid}))
    return {
        "cells": cells,
        "metadata": {"kernelspec": dict(KERNELSPEC),
                     "language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _dump(nb: dict) -> str:
    """JSON as nbformat writes it (indent 1, sorted keys), so re-saving changes nothing."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def course_files(*, rubric=None, solutions_dir: Path | None = None, suites_dir: Path | None = None,
                 labs: list[str] | None = None, include_dependencies: bool = False) -> dict[str, str]:
    """Relative path -> text of every file ``grader notebooks`` writes. StubError (naming
    file:line) when a solution cannot be turned into a notebook."""
    from grader import paths
    from grader.rubric import load_rubric
    from grader.stubs import StubError

    rubric = rubric or load_rubric(paths.RUBRIC)
    solutions_dir = Path(solutions_dir or paths.SOLUTIONS)
    suites_dir = Path(suites_dir or paths.SUITES)
    files = {CONFIG_FILE: NBGRADER_CONFIG}
    errors: list[str] = []
    for lab in labs or list(rubric.labs):
        if lab not in rubric.labs:
            raise StubError(f"{rubric.path}:1: unknown lab {lab!r}; the labs are {', '.join(rubric.labs)}")
        try:
            nb = build_notebook(lab, rubric=rubric, solutions_dir=solutions_dir,
                                suites_dir=suites_dir, dependencies_included=include_dependencies)
        except StubError as exc:
            errors.extend(exc.errors)
            continue
        files[f"source/{lab}/{lab}.ipynb"] = _dump(nb)
        if include_dependencies:
            import ast
            tree = ast.parse((solutions_dir / rubric.labs[lab].file).read_text(encoding="utf-8"))
            for dep in _lab_imports(tree):
                dep_file = solutions_dir / f"{dep}.py"
                if dep_file.is_file():
                    files[f"source/{lab}/{dep}.py"] = dep_file.read_text(encoding="utf-8")
    if errors:
        raise StubError(errors)
    return files


def write_course(out: str | Path, **kwargs) -> list[Path]:
    """Write :func:`course_files` under *out* (each file atomically); returns the paths. All
    notebooks are built before any file is written."""
    from grader.results import atomic_write_text

    out = Path(out)
    files = course_files(**kwargs)
    written = []
    for rel, text in files.items():
        target = out / rel
        atomic_write_text(target, text)
        written.append(target)
    return written


def private_jupyter_env(root: str | Path) -> dict:
    """Environment variables for a self-contained Jupyter under *root*: a 'python3'
    kernelspec for this interpreter and private config, data and runtime folders, so that
    nbgrader runs the course's notebooks with this environment's packages only."""
    root = Path(root)
    data = root / "jupyter" / "data"
    spec = data / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (attention-labs)", "language": "python"}))
    # ipykernel stops capturing output written to fd 1/2 when it sees PYTEST_CURRENT_TEST:
    # the kernels must behave as they do for a course, also when a test starts them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update({
        "JUPYTER_PATH": str(data), "JUPYTER_DATA_DIR": str(data),
        "JUPYTER_CONFIG_DIR": str(root / "jupyter" / "config"),
        "JUPYTER_RUNTIME_DIR": str(root / "jupyter" / "runtime"),
        "IPYTHONDIR": str(root / "jupyter" / "ipython"), "JUPYTER_PLATFORM_DIRS": "1",
        # nbgrader runs its database migrations with the `alembic` script of this environment
        "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
        "PYTHONWARNINGS": "ignore",
    })
    return env


_GENERATE_ASSIGNMENTS = """
import sys
from traitlets.config import Config
from nbgrader.apps import NbGraderAPI
config = Config()
config.CourseDirectory.root = sys.argv[1]
api = NbGraderAPI(config=config)
for lab in sys.argv[2:]:
    result = api.generate_assignment(lab)
    if not result["success"]:
        sys.exit(f"generate_assignment {lab} failed: {result['error']}\\n{result['log']}")
"""


def generate_assignments(course: str | Path, labs: list[str], *, env: dict,
                         timeout: float = 1800) -> subprocess.CompletedProcess:
    """``nbgrader generate_assignment`` for every lab of *course*, in one process (nbgrader's
    API: one start-up instead of one per lab); the caller checks ``returncode``."""
    return subprocess.run([sys.executable, "-c", _GENERATE_ASSIGNMENTS, str(course), *labs],
                          cwd=course, env=env, capture_output=True, text=True, timeout=timeout)


def course_drift(out: str | Path, **kwargs) -> list[str]:
    """Problems between the course folder *out* and what ``grader notebooks`` would write:
    missing or stale files (with the first differing line) and extra lab notebooks."""
    import difflib

    out = Path(out)
    files = course_files(**kwargs)
    problems = []
    for rel, expected in files.items():
        target = out / rel
        if not target.is_file():
            problems.append(f"{target}: missing (run `grader notebooks --out {out}`)")
            continue
        try:
            actual = target.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{target}: cannot read: {exc}")
            continue
        if actual != expected:
            diff = list(difflib.unified_diff(actual.splitlines(), expected.splitlines(),
                                             fromfile=str(target), tofile="generated", lineterm="", n=0))
            shown = "\n".join("    " + d for d in diff[:12])
            problems.append(f"{target}: stale, differs from what solutions/ and rubric.yaml "
                            f"generate (run `grader notebooks --out {out}`):\n{shown}")
    if (out / "source").is_dir() and not kwargs.get("labs"):
        for nb in sorted((out / "source").glob("*/lab*.ipynb")):
            if nb.relative_to(out).as_posix() not in files:
                problems.append(f"{nb}: extra notebook, no lab in the rubric generates it")
    return problems


# ======================================================================================
# Command line
# ======================================================================================


def cmd_notebooks(args) -> int:
    from grader import paths

    out = Path(args.out) if args.out else paths.COURSE / "notebooks"
    kwargs = {"labs": [args.lab] if args.lab else None,
              "include_dependencies": args.include_dependencies}
    if args.rubric:
        from grader.rubric import load_rubric
        kwargs["rubric"] = load_rubric(args.rubric)
    if args.check:
        problems = course_drift(out, **kwargs)
        for p in problems:
            print(p)
        print("notebooks are in sync" if not problems else f"{len(problems)} notebook problem(s)")
        return 1 if problems else 0
    for path in write_course(out, **kwargs):
        print(f"wrote {path}")
    return 0


def cmd_nbgrader_export(args) -> int:
    from grader.nbgrader_bridge import ExportError, export_results, load_result_files

    try:
        results = load_result_files([Path(p) for p in args.results], student=args.student)
        report = export_results(args.db, results, score=args.score,
                                include_missing=args.include_missing)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in report.lines:
        print(line)
    return 0 if report.ok else 1


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "notebooks", help="instructors: build the nbgrader course (source/<lab>/<lab>.ipynb)")
    p.add_argument("--out", help="the nbgrader course folder (default: notebooks/ in the course)")
    p.add_argument("--lab", help="only this lab")
    p.add_argument("--check", action="store_true",
                   help="only report notebooks that differ from what would be written")
    p.add_argument("--include-dependencies", action="store_true",
                   help="ship the reference code of the labs a lab imports (lab2 imports "
                        "lab1_attention) with its assignment; by default students bring their own")
    p.set_defaults(func=cmd_notebooks)

    p = subparsers.add_parser(
        "nbgrader-export",
        help="instructors: put grader results (results.json files, batch output) into an nbgrader gradebook")
    p.add_argument("results", nargs="+",
                   help="result files or folders searched for them (grader grade --out, grader batch)")
    p.add_argument("--db", required=True, help="the gradebook, e.g. sqlite:///course/gradebook.db")
    p.add_argument("--score", choices=["auto", "manual"], default="auto",
                   help="write the scores as nbgrader auto scores (default) or as manual scores, "
                        "which override what nbgrader autograde computes")
    p.add_argument("--student", help="the student id, when exporting one result file")
    p.add_argument("--include-missing", action="store_true",
                   help="also record 0 points for labs the submission did not contain")
    p.set_defaults(func=cmd_nbgrader_export)


if __name__ == "__main__":
    if sys.argv[1:] == ["--kernel-grade"]:
        sys.exit(_kernel_grade_main())
    print("usage: python -m grader.notebooks --kernel-grade  (used by the notebooks' test cells; "
          "see `grader notebooks --help`)", file=sys.stderr)
    sys.exit(2)
