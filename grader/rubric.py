"""Load and validate ``rubric.yaml`` (docs/internals.md, section 2).

Every problem found is reported, not just the first, as one line
``path:line: key.path: reason``; the line is the 1-based line of the offending key or
value in the YAML file.  :func:`discover_suite_tests` reads the test suites with ``ast``
(never importing them) and :func:`check_rubric_against_suites` cross-checks the two.
"""

from __future__ import annotations

import ast
import difflib
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from grader.errors import RubricError, SuiteError  # noqa: F401 - raised here, caught by callers

__all__ = [
    "DEFAULT_ATOL",
    "DEFAULT_RTOL",
    "DEFAULT_TIME_LIMIT_S",
    "LabRubric",
    "Rubric",
    "RubricError",
    "SuiteError",
    "SuiteTest",
    "TestRubric",
    "Tolerance",
    "check_rubric_against_suites",
    "discover_suite_tests",
    "load_rubric",
]

DEFAULT_TIME_LIMIT_S = 10.0
DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-4

VISIBILITIES = ("public", "hidden")
LAB_NAME_RE = re.compile(r"lab\d+_[a-z0-9_]+")
TEST_NAME_RE = re.compile(r"test_\w+")
DOTTED_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")

TOP_KEYS = ("version", "defaults", "lab_imports", "output_mode", "labs")
# What a lab's ``from lab1_attention import ...`` gives it while it is graded: the course's
# reference answering its calls (the default: a lab's points depend on its own code only),
# or the student's own file of that lab (cumulative grading).
LAB_IMPORTS = ("reference", "student")
# Who may read the files the grader writes: "group" (0644 less the umask, default) or
# "private" (0600: only the grader's user).
OUTPUT_MODES = ("group", "private")
DEFAULTS_KEYS = ("time_limit_s", "tolerance")
LAB_KEYS = ("title", "file", "tolerance", "time_limit_s", "forbidden", "exports", "tests")
TEST_KEYS = ("points", "visibility", "tolerance", "time_limit_s", "budget")
BUDGET_KEYS = ("memory_mb", "memory_factor", "work_ratio", "reference_ratio", "cpu_s", "why")
TOLERANCE_KEYS = ("atol", "rtol", "why")


# --------------------------------------------------------------------------------------
# Data model
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    why: str | None = None


@dataclass(frozen=True)
class Budget:
    """What a resource test allows a student call to use (grader.sandbox.usage measures it):
    ``memory_mb``, peak memory above the inputs in MiB; ``work_ratio``, how many times the
    CPU time may grow when the test's input size grows by its stated factor;
    ``reference_ratio``, how many times the CPU time of the course's reference on the same
    input, measured beside it in a worker like the student's, a call may take; ``cpu_s``,
    the CPU seconds a call may take on one thread (lab 8's ``train(seed, budget_s)``);
    ``memory_factor``, how many 8-byte numbers a call may hold per element of the size the
    test's O(...) states (e.g. L * window * d): the test derives its budget in MB from it
    for the shapes it uses, at each size it measures, and for the growth between them."""
    memory_mb: float | None = None
    memory_factor: float | None = None
    work_ratio: float | None = None
    why: str | None = None
    cpu_s: float | None = None
    reference_ratio: float | None = None


@dataclass(frozen=True)
class TestRubric:
    __test__ = False  # not a pytest test class

    name: str
    points: float
    visibility: str  # "public" | "hidden"
    tolerance: Tolerance
    time_limit_s: float
    line: int  # line of the test's key in rubric.yaml
    budget: Budget | None = None  # resource tests only


@dataclass(frozen=True)
class LabRubric:
    name: str
    title: str
    file: str
    tolerance: Tolerance
    time_limit_s: float
    forbidden: tuple[str, ...]
    tests: dict[str, TestRubric]  # insertion (file) order
    # The lab's contract functions (docs/LAB_CONTRACT.md's signature blocks): all that a
    # later lab may import of it ("Importing another lab"); () when it offers none.
    exports: tuple[str, ...] = ()

    @property
    def max_points(self) -> float:
        return float(sum(t.points for t in self.tests.values()))


@dataclass(frozen=True)
class Rubric:
    path: Path
    labs: dict[str, LabRubric]  # insertion (file) order
    lab_imports: str = "reference"   # one of LAB_IMPORTS
    output_mode: str = "group"       # one of OUTPUT_MODES

    @property
    def max_points(self) -> float:
        return float(sum(lab.max_points for lab in self.labs.values()))

    @property
    def all_forbidden(self) -> tuple[str, ...]:
        """Every lab's forbidden APIs, sorted: what a sandbox zygote guards against."""
        return tuple(sorted({name for lab in self.labs.values() for name in lab.forbidden}))

    def only(self, labs: list[str] | None) -> "Rubric":
        """This rubric with only ``labs`` (kept in the rubric's order; None or all: itself),
        e.g. what a one-lab batch scores out of. KeyError naming the labs for an unknown one."""
        if not labs or set(labs) == set(self.labs):
            return self
        unknown = [lab for lab in labs if lab not in self.labs]
        if unknown:
            raise KeyError(f"unknown lab(s) {', '.join(unknown)}; the labs are "
                           f"{', '.join(self.labs)}")
        return replace(self, labs={name: lab for name, lab in self.labs.items() if name in labs})

    def importable(self, calling_lab: str) -> dict[str, tuple[str, ...]]:
        """What ``calling_lab`` may import of other labs: earlier lab -> its exports (the
        contract functions of labs with a smaller number; never given code, helpers,
        contract extensions or a later lab). {} for a lab the rubric does not know."""
        if calling_lab not in self.labs:
            return {}
        number = lab_number(calling_lab)
        return {name: lab.exports for name, lab in self.labs.items()
                if lab.exports and lab_number(name) < number}

    def lab_for_file(self, filename: str | Path) -> LabRubric | None:
        """The lab whose ``file`` is the base name of *filename* (``lab1_attention.py``,
        ``some/dir/lab1_attention.py``), or None."""
        name = Path(filename).name
        for lab in self.labs.values():
            if lab.file == name:
                return lab
        return None

    def test(self, lab: str, name: str) -> TestRubric:
        """The rubric entry of test *name* of *lab*; KeyError (saying what exists) if none."""
        if lab not in self.labs:
            raise KeyError(f"{self.path}: no lab {lab!r} (labs: {', '.join(self.labs) or 'none'})")
        tests = self.labs[lab].tests
        if name not in tests:
            raise KeyError(f"{self.path}: no test {name!r} in labs.{lab}.tests")
        return tests[name]


def lab_number(lab: str) -> int:
    """The N of ``labN_name`` (the labs' order: a lab may import earlier ones only)."""
    match = re.match(r"lab(\d+)_", lab)
    return int(match.group(1)) if match else 0


@dataclass(frozen=True)
class SuiteTest:
    __test__ = False  # not a pytest test class

    name: str
    visibility: str  # the folder: "public" | "hidden"
    file: Path
    line: int




# --------------------------------------------------------------------------------------
# YAML loading
# --------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-5`` (no dot) as a float, as YAML 1.2 does."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _describe(node: yaml.Node, value: Any = None) -> str:
    """What came, for error messages."""
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"{node.value} (a bool)"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return f"the string {value!r}"
    return f"{node.value!r} (a {type(value).__name__})"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Validator:
    def __init__(self, path: Path, loader: _Loader):
        self.path = path
        self.loader = loader
        self._found: list[tuple[int, str]] = []

    @property
    def errors(self) -> list[str]:
        """Problems so far, by line (stable: same-line problems keep their order)."""
        return [msg for _, msg in sorted(self._found, key=lambda item: item[0])]

    def n_errors(self) -> int:
        return len(self._found)

    # -- reporting -----------------------------------------------------------------
    def error(self, node_or_line: yaml.Node | int, keypath: str, reason: str) -> None:
        line = node_or_line if isinstance(node_or_line, int) else node_or_line.start_mark.line + 1
        self._found.append((line, f"{self.path}:{line}: {keypath or '(top level)'}: {reason}"))

    # -- scalars -------------------------------------------------------------------
    def scalar(self, node: yaml.Node, keypath: str) -> tuple[bool, Any]:
        """(ok, value) of a scalar node; mappings/lists give (True, node) for callers to
        describe; unconstructable scalars (unknown tags) are reported and give (False, None)."""
        if not isinstance(node, yaml.ScalarNode):
            return True, node
        try:
            return True, self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            self.error(node, keypath, f"cannot read this value: {problem}")
            return False, None

    def got(self, node: yaml.Node, value: Any) -> str:
        return _describe(node, value)

    # -- mappings ------------------------------------------------------------------
    def mapping(
        self,
        node: yaml.Node,
        keypath: str,
        *,
        allowed: tuple[str, ...] | None,
        what: str,
    ) -> dict[str, tuple[yaml.Node, yaml.Node]] | None:
        """Entries of a mapping node, key -> (key node, value node), in file order.

        Reports a non-mapping, non-string keys, duplicate keys, and (when *allowed* is
        given) unknown keys, which are left out of the result."""
        if not isinstance(node, yaml.MappingNode):
            ok, value = self.scalar(node, keypath)
            if ok:
                self.error(node, keypath, f"expected {what}, got {self.got(node, value)}")
            return None
        entries: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else _describe(key_node)
                self.error(key_node, keypath, f"expected a plain name as key, got {shown}")
                continue
            key = str(key_node.value)
            sub = f"{keypath}.{key}" if keypath else key
            if key in first_line:
                self.error(key_node, sub, f"duplicate key {key!r} (first defined at line {first_line[key]})")
                continue
            first_line[key] = key_node.start_mark.line + 1
            if allowed is not None and key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.error(
                    key_node, sub, f"unknown key {key!r}{hint}; allowed keys: {', '.join(allowed)}"
                )
                continue
            entries[key] = (key_node, value_node)
        return entries

    def require(
        self,
        entries: dict[str, tuple[yaml.Node, yaml.Node]],
        key: str,
        owner_line: int,
        keypath: str,
        expected: str,
    ) -> bool:
        if key in entries:
            return True
        self.error(owner_line, f"{keypath}.{key}" if keypath else key, f"missing; expected {expected}")
        return False

    # -- typed values --------------------------------------------------------------
    def number(self, node: yaml.Node, keypath: str, *, positive: bool) -> float | None:
        expected = "a number > 0" if positive else "a number >= 0"
        ok, value = self.scalar(node, keypath)
        if not ok:
            return None
        if not _is_number(value) or not math.isfinite(value) or (value <= 0 if positive else value < 0):
            self.error(node, keypath, f"expected {expected}, got {self.got(node, value)}")
            return None
        return float(value)

    def string(self, node: yaml.Node, keypath: str, *, expected: str = "a string") -> str | None:
        ok, value = self.scalar(node, keypath)
        if not ok:
            return None
        if not isinstance(value, str) or not value.strip():
            self.error(node, keypath, f"expected {expected}, got {self.got(node, value)}")
            return None
        return value

    def tolerance(
        self, node: yaml.Node, keypath: str, *, need_why: bool, owner_line: int
    ) -> Tolerance | None:
        entries = self.mapping(
            node, keypath, allowed=TOLERANCE_KEYS, what="a mapping {atol: ..., rtol: ...}"
        )
        if entries is None:
            return None
        n_errors = self.n_errors()
        values: dict[str, float | None] = {}
        for key in ("atol", "rtol"):
            if self.require(entries, key, owner_line, keypath, "a number >= 0"):
                values[key] = self.number(entries[key][1], f"{keypath}.{key}", positive=False)
        why: str | None = None
        if "why" in entries:
            why = self.string(entries["why"][1], f"{keypath}.why", expected="a non-empty string")
        elif need_why:
            self.error(
                owner_line,
                f"{keypath}.why",
                "missing; a test's tolerance override must say why (the reason this test "
                "differs from its lab default)",
            )
        if self.n_errors() != n_errors:
            return None
        return Tolerance(atol=values["atol"], rtol=values["rtol"], why=why)  # type: ignore[arg-type]

    def budget(self, node: yaml.Node, keypath: str, *, owner_line: int) -> Budget | None:
        entries = self.mapping(node, keypath, allowed=BUDGET_KEYS,
                               what="a mapping {memory_mb: ..., memory_factor: ..., work_ratio: ..., "
                                    "reference_ratio: ..., cpu_s: ..., why: ...}")
        if entries is None:
            return None
        n_errors = self.n_errors()
        values: dict[str, float | None] = {}
        for key in ("memory_mb", "memory_factor", "work_ratio", "reference_ratio", "cpu_s"):
            if key in entries:
                values[key] = self.number(entries[key][1], f"{keypath}.{key}", positive=True)
        if not values and self.n_errors() == n_errors:
            self.error(owner_line, keypath, "expected memory_mb, memory_factor, work_ratio, "
                       "reference_ratio and/or cpu_s")
        why = None
        if self.require(entries, "why", owner_line, keypath, "a non-empty string"):
            why = self.string(entries["why"][1], f"{keypath}.why", expected="a non-empty string")
        if self.n_errors() != n_errors:
            return None
        return Budget(memory_mb=values.get("memory_mb"), memory_factor=values.get("memory_factor"),
                      work_ratio=values.get("work_ratio"),
                      cpu_s=values.get("cpu_s"), why=why,
                      reference_ratio=values.get("reference_ratio"))

    # -- document ------------------------------------------------------------------
    def document(self, root: yaml.Node | None) -> Rubric | None:
        if root is None:
            self.error(1, "(top level)", "empty rubric; expected a mapping with keys version, defaults, labs")
            return None
        top = self.mapping(root, "", allowed=TOP_KEYS, what="a mapping with keys version, defaults, labs")
        if top is None:
            return None
        root_line = root.start_mark.line + 1

        if self.require(top, "version", root_line, "", "version: 1"):
            key_node, node = top["version"]
            ok, value = self.scalar(node, "version")
            if ok and not (_is_number(value) and value == 1 and isinstance(value, int)):
                self.error(node, "version", f"expected 1, got {self.got(node, value)}")

        default_tol = Tolerance(DEFAULT_ATOL, DEFAULT_RTOL)
        default_time = DEFAULT_TIME_LIMIT_S
        if "defaults" in top:
            key_node, node = top["defaults"]
            entries = self.mapping(
                node, "defaults", allowed=DEFAULTS_KEYS, what="a mapping with keys time_limit_s, tolerance"
            )
            if entries:
                if "time_limit_s" in entries:
                    t = self.number(entries["time_limit_s"][1], "defaults.time_limit_s", positive=True)
                    default_time = t if t is not None else default_time
                if "tolerance" in entries:
                    k, v = entries["tolerance"]
                    tol = self.tolerance(
                        v, "defaults.tolerance", need_why=False, owner_line=k.start_mark.line + 1
                    )
                    default_tol = tol or default_tol

        lab_imports = "reference"
        if "lab_imports" in top:
            _, node = top["lab_imports"]
            ok, value = self.scalar(node, "lab_imports")
            if ok and value in LAB_IMPORTS:
                lab_imports = value
            elif ok:
                self.error(node, "lab_imports", f"expected one of {', '.join(LAB_IMPORTS)}, "
                                                f"got {self.got(node, value)}")

        output_mode = "group"
        if "output_mode" in top:
            _, node = top["output_mode"]
            ok, value = self.scalar(node, "output_mode")
            if ok and value in OUTPUT_MODES:
                output_mode = value
            elif ok:
                self.error(node, "output_mode", f"expected one of {', '.join(OUTPUT_MODES)}, "
                                                f"got {self.got(node, value)}")

        labs: dict[str, LabRubric] = {}
        if self.require(top, "labs", root_line, "", "a mapping of labs (lab1_attention: ...)"):
            key_node, node = top["labs"]
            entries = self.mapping(node, "labs", allowed=None, what="a mapping of labs (lab1_attention: ...)")
            if entries is not None and not entries and isinstance(node, yaml.MappingNode):
                self.error(node, "labs", "expected at least one lab, got an empty mapping")
            for name, (k, v) in (entries or {}).items():
                lab = self.lab(name, k, v, default_tol, default_time)
                if lab is not None:
                    labs[name] = lab
        if self.errors:
            return None
        return Rubric(path=self.path, labs=labs, lab_imports=lab_imports,
                      output_mode=output_mode)

    def lab(
        self,
        name: str,
        key_node: yaml.Node,
        node: yaml.Node,
        default_tol: Tolerance,
        default_time: float,
    ) -> LabRubric | None:
        keypath = f"labs.{name}"
        key_line = key_node.start_mark.line + 1
        n_errors = self.n_errors()
        if not LAB_NAME_RE.fullmatch(name):
            self.error(
                key_node,
                keypath,
                f"lab name must match lab<N>_<name> (lowercase letters, digits, _), got {name!r}",
            )
        entries = self.mapping(node, keypath, allowed=LAB_KEYS, what="a mapping with keys " + ", ".join(LAB_KEYS))
        if entries is None:
            return None

        title = file = None
        if self.require(entries, "title", key_line, keypath, "a string"):
            title = self.string(entries["title"][1], f"{keypath}.title", expected="a non-empty string")
        if self.require(entries, "file", key_line, keypath, f"the file name {name + '.py'!r}"):
            file = self.string(entries["file"][1], f"{keypath}.file", expected=f"the file name {name + '.py'!r}")
            if file is not None:
                fnode = entries["file"][1]
                if "/" in file or "\\" in file or not file.endswith(".py"):
                    self.error(fnode, f"{keypath}.file", f"expected a file name ending in .py, got {file!r}")
                elif file[: -len(".py")] != name:
                    self.error(
                        fnode,
                        f"{keypath}.file",
                        f"the file's stem must equal the lab name: expected {name + '.py'!r}, got {file!r}",
                    )

        tol = default_tol
        if "tolerance" in entries:
            k, v = entries["tolerance"]
            t = self.tolerance(v, f"{keypath}.tolerance", need_why=False, owner_line=k.start_mark.line + 1)
            tol = t or tol
        time_limit = default_time
        if "time_limit_s" in entries:
            t2 = self.number(entries["time_limit_s"][1], f"{keypath}.time_limit_s", positive=True)
            time_limit = t2 if t2 is not None else time_limit

        forbidden: list[str] = []
        if "forbidden" in entries:
            fnode = entries["forbidden"][1]
            fpath = f"{keypath}.forbidden"
            if not isinstance(fnode, yaml.SequenceNode):
                ok, value = self.scalar(fnode, fpath)
                if ok:
                    self.error(
                        fnode, fpath, f"expected a list of dotted names (torch.nn.X), got {self.got(fnode, value)}"
                    )
            else:
                for i, item in enumerate(fnode.value):
                    ipath = f"{fpath}[{i}]"
                    ok, value = self.scalar(item, ipath)
                    if not ok:
                        continue
                    if not isinstance(value, str) or not DOTTED_NAME_RE.fullmatch(value):
                        self.error(
                            item, ipath, f"expected a dotted name like torch.nn.Linear, got {self.got(item, value)}"
                        )
                    elif value in forbidden:
                        self.error(item, ipath, f"{value!r} is listed twice")
                    else:
                        forbidden.append(value)

        exports = self.identifiers(entries, "exports", keypath)

        tests: dict[str, TestRubric] = {}
        if self.require(entries, "tests", key_line, keypath, "a mapping of test names to {points, visibility}"):
            tnode = entries["tests"][1]
            tentries = self.mapping(
                tnode, f"{keypath}.tests", allowed=None, what="a mapping of test names to {points, visibility}"
            )
            if tentries is not None and not tentries and isinstance(tnode, yaml.MappingNode):
                self.error(tnode, f"{keypath}.tests", "expected at least one test, got an empty mapping")
            for tname, (k, v) in (tentries or {}).items():
                test = self.test(tname, k, v, f"{keypath}.tests.{tname}", tol, time_limit)
                if test is not None:
                    tests[tname] = test

        if self.n_errors() != n_errors:
            return None
        return LabRubric(
            name=name,
            title=title,  # type: ignore[arg-type]
            file=file,  # type: ignore[arg-type]
            tolerance=tol,
            time_limit_s=time_limit,
            forbidden=tuple(forbidden),
            tests=tests,
            exports=tuple(exports),
        )

    def identifiers(self, entries: dict, key: str, keypath: str) -> list[str]:
        """``entries[key]``: a list of distinct Python names ([] when absent)."""
        out: list[str] = []
        if key not in entries:
            return out
        node, path = entries[key][1], f"{keypath}.{key}"
        if not isinstance(node, yaml.SequenceNode):
            ok, value = self.scalar(node, path)
            if ok:
                self.error(node, path, f"expected a list of function names, got {self.got(node, value)}")
            return out
        for i, item in enumerate(node.value):
            ok, value = self.scalar(item, f"{path}[{i}]")
            if not ok:
                continue
            if not isinstance(value, str) or not value.isidentifier() or value.startswith("_"):
                self.error(item, f"{path}[{i}]", f"expected a public function name, got {self.got(item, value)}")
            elif value in out:
                self.error(item, f"{path}[{i}]", f"{value!r} is listed twice")
            else:
                out.append(value)
        return out

    def test(
        self,
        name: str,
        key_node: yaml.Node,
        node: yaml.Node,
        keypath: str,
        lab_tol: Tolerance,
        lab_time: float,
    ) -> TestRubric | None:
        key_line = key_node.start_mark.line + 1
        n_errors = self.n_errors()
        if not TEST_NAME_RE.fullmatch(name):
            self.error(key_node, keypath, f"test name must match test_<name> (a pytest function name), got {name!r}")
        entries = self.mapping(
            node, keypath, allowed=TEST_KEYS, what="a mapping like {points: 1, visibility: public}"
        )
        if entries is None:
            return None
        points = visibility = None
        if self.require(entries, "points", key_line, keypath, "a number >= 0"):
            points = self.number(entries["points"][1], f"{keypath}.points", positive=False)
        if self.require(entries, "visibility", key_line, keypath, "public or hidden"):
            vnode = entries["visibility"][1]
            ok, value = self.scalar(vnode, f"{keypath}.visibility")
            if ok:
                if isinstance(value, str) and value in VISIBILITIES:
                    visibility = value
                else:
                    self.error(
                        vnode, f"{keypath}.visibility", f"expected public or hidden, got {self.got(vnode, value)}"
                    )
        tol = lab_tol
        if "tolerance" in entries:
            k, v = entries["tolerance"]
            t = self.tolerance(v, f"{keypath}.tolerance", need_why=True, owner_line=k.start_mark.line + 1)
            tol = t or tol
        time_limit = lab_time
        if "time_limit_s" in entries:
            t2 = self.number(entries["time_limit_s"][1], f"{keypath}.time_limit_s", positive=True)
            time_limit = t2 if t2 is not None else time_limit
        budget = None
        if "budget" in entries:
            k, v = entries["budget"]
            budget = self.budget(v, f"{keypath}.budget", owner_line=k.start_mark.line + 1)
        if self.n_errors() != n_errors:
            return None
        return TestRubric(
            name=name,
            points=points,  # type: ignore[arg-type]
            visibility=visibility,  # type: ignore[arg-type]
            tolerance=tol,
            time_limit_s=time_limit,
            line=key_line,
            budget=budget,
        )


def load_rubric(path: str | Path) -> Rubric:
    """Load and validate *path*; RubricError listing every problem found."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if path.name == "rubric.yaml":
            raise RubricError(f"no rubric.yaml in {path.parent.resolve()} (pass --course DIR "
                              "or set GRADER_COURSE_DIR)") from None
        raise RubricError(f"{path}: rubric file not found") from None
    except IsADirectoryError:
        raise RubricError(f"{path}: expected a rubric file, got a directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RubricError(f"{path}: cannot read rubric: {exc}") from None

    loader = _Loader(text)
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else 1
            reason = exc.problem or "invalid YAML"
            if exc.context:
                reason = f"{exc.context}, {reason}"
            raise RubricError(f"{path}:{line}: invalid YAML: {reason}") from None
        except yaml.YAMLError as exc:
            raise RubricError(f"{path}:1: invalid YAML: {exc}") from None
        validator = _Validator(path, loader)
        rubric = validator.document(root)
    finally:
        loader.dispose()
    if validator.errors or rubric is None:
        raise RubricError(validator.errors or [f"{path}:1: (top level): invalid rubric"])
    return rubric


# --------------------------------------------------------------------------------------
# Suites
# --------------------------------------------------------------------------------------


def _suite_tests_in(file: Path, visibility: str) -> tuple[list[SuiteTest], list[str]]:
    try:
        source = file.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(file))
    except SyntaxError as exc:
        return [], [f"{file}:{exc.lineno or 1}: cannot read the suite: {exc.msg}"]
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return [], [f"{file}:1: cannot read the suite: {exc}"]
    found: list[SuiteTest] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            found.append(SuiteTest(node.name, visibility, file, node.lineno))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test_"):
                    found.append(SuiteTest(item.name, visibility, file, item.lineno))
    return found, []


def _discover(suites_dir: Path) -> tuple[dict[str, dict[str, SuiteTest]], list[str]]:
    result: dict[str, dict[str, SuiteTest]] = {}
    errors: list[str] = []
    for visibility in VISIBILITIES:
        folder = suites_dir / visibility
        if not folder.is_dir():
            continue
        for file in sorted(folder.glob("test_*.py")):
            lab = file.stem[len("test_") :]
            tests, errs = _suite_tests_in(file, visibility)
            errors.extend(errs)
            bucket = result.setdefault(lab, {})
            for t in tests:
                if t.name in bucket:
                    first = bucket[t.name]
                    errors.append(
                        f"{t.file}:{t.line}: test {t.name!r} of {lab} is defined twice "
                        f"(also at {first.file}:{first.line}); rubric keys are test names, "
                        "so each must be unique within a lab"
                    )
                    continue
                bucket[t.name] = t
    return result, errors


def discover_suite_tests(suites_dir: str | Path) -> dict[str, dict[str, SuiteTest]]:
    """lab -> test name -> SuiteTest for ``suites_dir/{public,hidden}/test_<lab>.py``.

    Reads the files with ``ast`` (never imports them).  Tests are top-level ``def test_*``
    / ``async def test_*`` and ``test_*`` methods of top-level ``class Test*``.  A name
    defined twice for one lab (in one file or in both folders) raises SuiteError."""
    result, errors = _discover(Path(suites_dir))
    if errors:
        raise SuiteError(errors)
    return result


def check_rubric_against_suites(rubric: Rubric, suites_dir: str | Path) -> list[str]:
    """Problems (``path:line: reason``) between the rubric and the suites in *suites_dir*."""
    suites_dir = Path(suites_dir)
    suites, problems = _discover(suites_dir)
    for visibility in VISIBILITIES:
        for file in sorted((suites_dir / visibility).glob("test_*.py")):
            lab = file.stem[len("test_") :]
            if lab not in rubric.labs:
                problems.append(
                    f"{file}:1: suite for lab {lab!r}, which is not in {rubric.path} "
                    f"(labs there: {', '.join(rubric.labs) or 'none'})"
                )
    for lab, tests in suites.items():
        if lab not in rubric.labs:
            continue
        entries = rubric.labs[lab].tests
        for name, t in tests.items():
            if name not in entries:
                problems.append(
                    f"{t.file}:{t.line}: test {name!r} has no rubric entry; add "
                    f"labs.{lab}.tests.{name} (visibility: {t.visibility}) to {rubric.path}"
                )
    for lab_name, lab in rubric.labs.items():
        found = suites.get(lab_name, {})
        for name, entry in lab.tests.items():
            keypath = f"labs.{lab_name}.tests.{name}"
            t = found.get(name)
            if t is None:
                expected = suites_dir / entry.visibility / f"test_{lab_name}.py"
                near = difflib.get_close_matches(name, list(found), n=1, cutoff=0.6)
                hint = (f"; did you mean {near[0]!r} ({found[near[0]].file}:"
                        f"{found[near[0]].line})?" if near else "")
                problems.append(f"{rubric.path}:{entry.line}: {keypath}: no test function "
                                f"{name!r} in {expected}{hint}")
            elif t.visibility != entry.visibility:
                problems.append(
                    f"{rubric.path}:{entry.line}: {keypath}: visibility is {entry.visibility!r} "
                    f"but the test is in the {t.visibility} suite ({t.file}:{t.line})"
                )
    return problems
