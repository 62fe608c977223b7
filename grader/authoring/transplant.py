"""No lab's given code answers another lab (``grader validate``, #41).

A stub hands every student some code in full: helpers (lab 8's ``make_batch``), given
methods (``Seq2SeqTransformer.embed``). If one of them computed what another lab grades,
a student could copy it there for points. This module builds, for every lab and every piece
of given code in the *other* labs' stubs, a candidate file: the lab's stub with that given
code pasted in and standing in for every function and method the stub leaves to the student.
``grader validate`` grades each candidate (all of the lab's tests) and expects 0.

Standing in for all of them at once is at least as generous as for one at a time: a test
passes only if every student function it calls works, and those left as stubs raise.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

TRANSPLANTED = "_given_elsewhere"   # the name the pasted code gets in the candidate


@dataclass(frozen=True)
class GivenCode:
    """A function or method a stub gives in full: ``where`` is ``name`` or ``Class.name``."""
    lab_file: str
    where: str
    source: str            # the def, dedented, renamed to TRANSPLANTED
    preamble: str          # the stub's non-lab imports and module-level constants


def _is_stub(node: ast.AST) -> bool:
    """The body raises NotImplementedError (the stub idiom: the student writes it)."""
    return any(isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n)
               for n in ast.walk(node))


def _preamble(tree: ast.Module) -> str:
    """Imports other than of a lab, and module-level assignments of constants."""
    keep = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            if not (module or "").startswith("lab"):
                keep.append(ast.unparse(node))
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name | ast.Tuple)
                                                   for t in node.targets):
            keep.append(ast.unparse(node))
    return "\n".join(keep)


def given_code(stub: Path) -> list[GivenCode]:
    """Every top-level function and every method (not ``__init__``) that ``stub`` gives in
    full."""
    tree = ast.parse(stub.read_text(encoding="utf-8"))
    preamble = _preamble(tree)
    found = []

    def add(node: ast.FunctionDef, where: str) -> None:
        renamed = ast.FunctionDef(**{**node.__dict__, "name": TRANSPLANTED,
                                     "decorator_list": []})
        found.append(GivenCode(stub.name, where, ast.unparse(renamed), preamble))

    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not _is_stub(node):
            add(node, node.name)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if (isinstance(item, ast.FunctionDef) and item.name != "__init__"
                        and not _is_stub(item)):
                    add(item, f"{node.name}.{item.name}")
    return found


def student_parts(stub: Path) -> list[str]:
    """What ``stub`` leaves to the student: ``name`` or ``Class.name``."""
    tree = ast.parse(stub.read_text(encoding="utf-8"))
    parts = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and _is_stub(n)]
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            parts += [f"{node.name}.{m.name}" for m in node.body
                      if isinstance(m, ast.FunctionDef) and _is_stub(m)]
    return parts


def candidate(stub: Path, given: GivenCode) -> str:
    """``stub``'s text with ``given`` pasted in and standing in for every student part."""
    aliases = "\n".join(f"{part} = {TRANSPLANTED}" for part in student_parts(stub))
    text = stub.read_text(encoding="utf-8")
    own = {t.id for node in ast.parse(text).body if isinstance(node, ast.Assign)
           for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)}
    # The other stub's constants, but never one that would change this lab's own.
    preamble = "\n".join(line for line in given.preamble.splitlines()
                         if line.startswith(("import ", "from "))
                         or not {t.id for t in ast.walk(ast.parse(line))
                                 if isinstance(t, ast.Name)} & own)
    return (text.rstrip() + "\n\n\n"
            f"# ---- {given.lab_file}'s given {given.where}, put in this lab's place "
            "(grader validate)\n"
            f"{preamble}\n\n{given.source}\n\n\n{aliases}\n")


def candidates(exercises: Path, lab_files: list[str]) -> list[tuple[str, GivenCode, str]]:
    """(lab file, the given code of another lab, the candidate text) for every pair."""
    given = {f: given_code(exercises / f) for f in lab_files if (exercises / f).is_file()}
    out = []
    for lab_file in lab_files:
        if not (exercises / lab_file).is_file():
            continue
        for other, pieces in given.items():
            if other != lab_file:
                out += [(lab_file, g, candidate(exercises / lab_file, g)) for g in pieces]
    return out
