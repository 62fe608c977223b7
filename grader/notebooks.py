"""The lab notebooks' test cells: ``check`` runs in the student's kernel.

The notebooks are built by ``grader.authoring.course_notebooks`` (``grader notebooks``);
each has one autograder test cell per public rubric test, worth the rubric's points, and one
cell for all hidden tests, worth their sum. A test cell does not test anything itself: it
calls :func:`check`, which hands the code this kernel has run to the grader in a separate
process (the same sandboxed engine as ``grader grade``) and turns the result of that one test
into a pass (no output on stderr) or a failure (an error output whose text is the grader's
message). The hidden tests' cell calls :func:`check_hidden`, whose result is the points of
the hidden tests that passed (nbgrader's partial credit). Hidden tests sit in ``### BEGIN
HIDDEN TESTS`` regions and name their tests only by opaque ids, so neither released
notebooks, nor feedback, nor tracebacks show them.

This module is imported inside students' kernels (by the test cells): keep its top level light.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from grader.intake.notebook import LAB_MODULE_RE, hidden_test_id
import contextlib

__all__ = ["GraderUnavailable", "TestFailed", "check", "check_hidden", "provided_when_graded"]

KERNEL_GRADE_TIMEOUT_S = 900
# What a test cell's own verdict is worth: code in this kernel can change what it prints.
ADVISORY = "advisory: the grade is what the sandboxed grader gives when the notebook is graded"
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


def provided_when_graded(lab: str, name: str):
    """What ``from <lab> import <name>`` gives a notebook whose kernel cannot import that lab:
    a function that says how to run it here. Graded, the lab gets the course's reference."""
    number = lab.removeprefix("lab").split("_", 1)[0]

    def unavailable(*args, **kwargs):
        raise RuntimeError(
            f"{name} is Lab {number}'s, and this kernel has none yet: paste your Lab {number} "
            f"{name} into this notebook's scratch cell and run that cell (nothing in it is "
            f"graded). When this lab is graded, and in its test cells, the grader gives it the "
            f"course's {name}: your Lab {number} costs this lab no points.")
    unavailable.__name__ = unavailable.__qualname__ = name
    return unavailable


def _kernel_cells() -> list[dict]:
    try:
        from IPython import get_ipython
    except ImportError:
        get_ipython = None
    ip = get_ipython() if get_ipython else None
    if ip is None or not hasattr(ip, "history_manager"):
        raise GraderUnavailable("check() grades the cells this Jupyter kernel has run; "
                                "call it from a notebook (or use `grader check` on a folder)")
    from grader.intake.notebook import is_test_cell

    raw = list(ip.history_manager.input_hist_raw)
    # Test cells are left out here already, so that running one more of them does not
    # change the code, and the result of the first is reused.
    return [{"label": f"In[{i}]", "source": src} for i, src in enumerate(raw)
            if i > 0 and isinstance(src, str) and src.strip() and not is_test_cell(src)]


def _kernel_dependencies(lab: str) -> dict[str, str]:
    """Other lab modules this kernel imported from files (lab2 imports lab1_attention)."""
    deps = {}
    for name, module in list(sys.modules.items()):
        if name == lab or not LAB_MODULE_RE.fullmatch(name):
            continue
        path = getattr(module, "__file__", None)
        if path and path.endswith(".py") and os.path.isfile(path):
            with contextlib.suppress(OSError, UnicodeDecodeError):
                deps[f"{name}.py"] = Path(path).read_text(encoding="utf-8")
    return deps


def _run_grader(request: dict, course: str | Path | None = None) -> dict:
    """Grade in a fresh process: ``python -m grader.cli.kernel_grade [--course DIR]`` (JSON
    in, JSON out), run from an empty folder so that nothing next to the notebook shadows a
    package. The course: ``course``, else what the command line finds (``--course``'s
    fallbacks: ``GRADER_COURSE_DIR``, else the kit)."""
    where = ["--course", str(course)] if course is not None else []
    with tempfile.TemporaryDirectory(prefix="grader-nb-") as cwd:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "grader.cli.kernel_grade", *where],
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


def _reply(lab: str) -> dict:
    """The grader's result for the code this kernel has run (graded once per version).
    Nothing is written to stderr, so a warning printed by a library cannot cost points."""
    import contextlib
    import io
    import warnings

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
    return reply


def _points(points: float) -> str:
    return f"{points:g} point{'s' if points != 1 else ''}"


def _failure(outcome: dict, reply: dict) -> str:
    message = outcome.get("message", "")[:_MAX_SHOWN]
    notes = reply.get("notes", [])
    if notes:
        message += "\n" + "\n".join(f"Note: {n}" for n in notes)
    return message


def check(lab: str, test: str | None = None, *, hidden: str | None = None) -> None:
    """Run rubric test *test* (public) or the hidden test with id *hidden* of *lab* on the code
    this kernel has run, in the grader's sandbox; raise :class:`TestFailed` unless it passed.

    The whole lab is graded once per version of the code (later test cells reuse the result).
    Nothing is written to stderr, so a warning printed by a library cannot cost the points."""
    if (test is None) == (hidden is None):
        raise GraderUnavailable("check() needs a test name or hidden=<id>")
    reply = _reply(lab)
    kind = "hidden" if hidden is not None else "public"
    outcome = reply.get(kind, {}).get(hidden if hidden is not None else test)
    what = "hidden test" if hidden is not None else test
    if outcome is None:
        raise GraderUnavailable(f"{lab} has no {kind} test {what!r} in the grader's rubric "
                                "(is this notebook older than the course's rubric?)")
    points = outcome["points"]
    if outcome["passed"]:
        print(f"passed: {what} ({_points(points)}; {ADVISORY})")
        return
    raise TestFailed(f"FAILED: {what} (0 of {_points(points)}; {ADVISORY})",
                     _failure(outcome, reply))


def check_hidden(lab: str, ids: list[str]) -> float:
    """The hidden tests of *lab* with opaque ids *ids*, all in one cell: print a line for
    each and return the points of those that passed (the cell's result, which nbgrader reads
    as the cell's partial credit). Advisory, like :func:`check`: what nbgrader records is
    what the sandboxed grader gives (grader.authoring.nbgrader_autograde)."""
    reply = _reply(lab)
    earned, lines = 0.0, []
    for k, hidden in enumerate(ids, start=1):
        outcome = reply.get("hidden", {}).get(hidden)
        what = f"hidden test {k} of {len(ids)}"
        if outcome is None:
            raise GraderUnavailable(f"{lab} has no hidden test {hidden!r} in the grader's "
                                    "rubric (is this notebook older than the course's rubric?)")
        points = outcome["points"]
        if outcome["passed"]:
            earned += points
            lines.append(f"passed: {what} ({_points(points)})")
        else:
            lines.append(f"FAILED: {what} (0 of {_points(points)})")
            lines += [f"    {ln}" for ln in _failure(outcome, reply).splitlines()]
    print("\n".join(lines + [f"hidden tests: {earned:g} points ({ADVISORY})"]))
    return earned


def kernel_grade(request: dict, course) -> dict:
    """The trusted side of :func:`check` (runs in the subprocess, ``grader.cli.kernel_grade``,
    which passes the ``Course``)."""
    from grader.errors import NotebookError
    from grader.grading import Grader
    from grader.intake.notebook import Cell, extract_lab_source, given_imports, is_test_cell

    rubric = course.rubric
    lab = request.get("lab")
    if lab not in rubric.labs:
        return {"ok": False, "error": f"unknown lab {lab!r}; the labs are {', '.join(rubric.labs)}"}
    spec = rubric.labs[lab]
    visibility = ("public", "hidden") if (course.suites / "hidden" / f"test_{lab}.py").is_file() \
        else ("public",)
    cells = [Cell(label=str(c["label"]), source=str(c["source"]), test=is_test_cell(str(c["source"])))
             for c in request.get("cells", [])]
    reply: dict = {"ok": True, "public": {}, "hidden": {}, "notes": []}

    def record(name, t_visibility, points, passed, message):
        key = hidden_test_id(lab, name) if t_visibility == "hidden" else name
        reply[t_visibility][key] = {"points": points, "passed": passed, "message": message}

    try:
        got = extract_lab_source(cells, name=f"{lab} (this notebook)",
                                 prelude=given_imports(spec.file, course.solutions),
                                 forbidden=spec.forbidden)
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
        with Grader(course, visibility=visibility) as grader:
            result = grader.grade(tmp, labs=[lab], name=lab)
    for t in result.lab(lab).tests:
        record(t.name, t.visibility, t.max_score, t.passed, t.message)
    return reply
