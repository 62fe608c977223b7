#!/usr/bin/env python3
"""The layers contract of the grader package: imports go one way, and never in a cycle.

Every ``import`` and ``from ... import`` in ``grader/`` counts, at module level or inside a
function (an import made late is still a dependency). Each module belongs to one layer; a
module may import its own layer or a lower one, never a higher one, and the import graph
must have no cycle. A module no layer names fails the check, so a new module has to be
placed on purpose. Run: ``python .ci/layers.py`` (exit 1 and one line per violation).

The trust line is checked too: the worker side (``WORKER_ENTRY``, the zygote, and every
sibling module of ``grader/sandbox/`` it imports by name, at any depth: the code that runs
in the sandboxed worker, loaded by path) may import only the standard library, the
``WORKER_PACKAGES`` (torch and its siblings) and those sibling modules: never the grader
package, whose code has no business next to student code.

The layers, top to bottom (docs/internals.md, "Module map"):
"""

from __future__ import annotations

import ast
import fnmatch
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "grader"

# Top first. Patterns are module names; the first layer whose pattern matches wins.
LAYERS: list[tuple[str, list[str]]] = [
    ("cli", ["grader.cli", "grader.cli.*"]),
    ("routes", ["grader.batch", "grader.batch.*", "grader.authoring", "grader.authoring.*",
                "grader.autograder", "grader.autograder.*", "grader.notebooks"]),
    ("grading", ["grader.grading"]),
    ("suites", ["grader.engine.suite_runner", "grader.engine.plugin"]),
    # The suites: trusted test code that pytest loads; they may use the engine's helpers,
    # and nothing below them (the diagnosis) may reach into them.
    ("suite code", ["grader.suites", "grader.suites.*"]),
    ("diagnosis", ["grader.diagnose", "grader.mistakes", "grader.mistakes.*"]),
    ("proxy", ["grader.engine", "grader.engine.*", "grader.intake", "grader.intake.*",
               "grader.outputs", "grader.outputs.*", "grader.similarity"]),
    ("base", ["grader.sandbox", "grader.sandbox.*", "grader.results",
              "grader.rubric", "grader.course", "grader.paths", "grader.errors", "grader.secret", "grader"]),
]
EXCLUDED: list[str] = []
# The worker side: the zygote's file, and the modules it imports by bare name from its own
# folder (it runs with grader/sandbox/ as its path, never the grader package).
WORKER_ENTRY = Path("sandbox") / "zygote.py"
# The portable backend's worker (grader.sandbox.portable) is an entry of its own.
WORKER_ENTRIES = (WORKER_ENTRY, Path("sandbox") / "portable_worker.py")
WORKER_PACKAGES = {"torch", "numpy"}    # numpy: torch's sibling, preloaded by the zygote


def module_name(path: Path, top: Path = ROOT) -> str:
    parts = list(path.relative_to(top).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int | None:
    for rank, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return len(LAYERS) - rank       # higher number = higher layer
    return None


def imports_of(path: Path, module: str, known: set[str]) -> dict[str, int]:
    """The grader modules ``path`` imports (anywhere in the file) -> the line of the first."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        # "grader.a.b" may name a module or something in module "grader.a".
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.setdefault(name, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "grader" or alias.name.startswith("grader."):
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target != "grader" and not target.startswith("grader."):
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                add(full if full in known else target, node.lineno)
    return found


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def check(root: Path = PACKAGE) -> list[str]:
    """One line per violation in the package at ``root`` (a folder named ``grader``)."""
    top = root.parent
    files = {}
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, top)
        if not any(fnmatch.fnmatchcase(name, p) for p in EXCLUDED):
            files[name] = path
    known = set(files)
    problems, graph = [], {}
    for name, path in files.items():
        rank = layer_of(name)
        if rank is None:
            problems.append(f"{path.relative_to(top)}: module {name} is in no layer of "
                            ".ci/layers.py; place it in one")
            continue
        graph[name] = imports_of(path, name, known)
        for target, line in sorted(graph[name].items()):
            target_rank = layer_of(target)
            if target_rank is not None and target_rank > rank:
                problems.append(
                    f"{path.relative_to(top)}:{line}: {name} ({LAYERS[len(LAYERS) - rank][0]}) "
                    f"imports {target} ({LAYERS[len(LAYERS) - target_rank][0]}), a higher layer")
    cycle = find_cycle(graph)
    if cycle:
        problems.append("import cycle: " + " -> ".join(cycle))
    return problems


def worker_side(root: Path = PACKAGE) -> dict[str, Path]:
    """The worker side's modules (bare name -> file): ``WORKER_ENTRY`` and what it imports
    from its own folder, transitively."""
    entries = [root / e for e in WORKER_ENTRIES if (root / e).is_file()]
    if not entries:
        return {}
    folder, found, todo = entries[0].parent, {}, list(entries)
    while todo:
        path = todo.pop()
        found[path.stem] = path
        for name, _line, _level in _all_imports(path):
            top = name.split(".")[0]
            if top not in found and (folder / f"{top}.py").is_file():
                todo.append(folder / f"{top}.py")
    return found


def _all_imports(path: Path) -> list[tuple[str, int, int]]:
    """Every module ``path`` imports: (name, line, relative level), anywhere in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno, 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, node.lineno, node.level))
        elif isinstance(node, ast.ImportFrom):          # from . import x
            out.extend((alias.name, node.lineno, node.level) for alias in node.names)
    return out


def check_worker_side(root: Path = PACKAGE) -> list[str]:
    """One line per import of the worker side that crosses the trust line."""
    modules = worker_side(root)
    problems = []
    for name, path in sorted(modules.items()):
        for target, line, level in _all_imports(path):
            top = target.split(".")[0]
            if not level and (top in modules or top in sys.stdlib_module_names
                              or top in WORKER_PACKAGES):
                continue
            shown = "." * level + target
            problems.append(
                f"{path.relative_to(root.parent)}:{line}: {name} runs in the sandboxed worker "
                f"and imports {shown}; the worker side may import only the standard library, "
                f"{', '.join(sorted(WORKER_PACKAGES))} and its sibling modules "
                f"({', '.join(sorted(modules))})")
    return problems


def main() -> int:
    problems = check() + check_worker_side()
    for p in problems:
        print(p)
    if not problems:
        print(f"layers: ok ({' > '.join(name for name, _ in LAYERS)}; no cycle; worker side: "
              f"{', '.join(sorted(worker_side()))} import only the standard library and "
              f"{', '.join(sorted(WORKER_PACKAGES))})")
    return 1 if problems else 0


__doc__ += "\n".join(f"    {name}: {', '.join(patterns)}" for name, patterns in LAYERS) + "\n"

if __name__ == "__main__":
    sys.exit(main())
