"""``nbgrader autograde`` without a kernel: grades and test cells' outputs from the sandbox.

Left to nbgrader, autograde runs the student's notebook in a Jupyter kernel on the grading
machine, as the grader's user, with the course importable: one extra cell could read the
course secret, the solutions and the hidden suites, print them into the feedback, or write
into the course folder; and whatever it did to that kernel (``sys.modules``, builtins,
IPython's hooks) would decide what the test cells print. So the course's
``nbgrader_config.py`` (grader/authoring/course_notebooks.py) takes nbgrader's ``Execute``
out of ``Autograde.autograde_preprocessors`` and puts ``SandboxedGrades`` in: no kernel is
started and no cell of the notebook runs on the grading machine.

``SandboxedGrades`` grades the notebook's code in nbgrader's own (trusted) process with
``grading.Grader``, as ``grader grade`` grades a ``.ipynb``: the code is extracted from the
cells (grader.intake.notebook: definitions only, never run there) and runs only in sandbox
workers. It then sets every test cell's outputs from that result: a "passed" line on stdout
for a pass, an error output with the grader's message for a failure; the one cell of all
hidden tests gets a line per test and, as its result, the points of those that passed
(nbgrader's partial credit). Every other code cell is left without outputs. nbgrader then
scores each test cell from those outputs, as always.

It refuses to take part in a pipeline that also runs a kernel (nbgrader's ``Execute``, or
any other nbclient-based step): an old config, or one edited back to nbgrader's defaults,
fails loudly before the kernel starts instead of running student code beside the grader.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from nbclient import NotebookClient
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

from grader.course import Course
from grader.errors import NotebookError, UsageError
from grader.grading import Grader
from grader.intake.notebook import (HIDDEN_TESTS_GRADE_ID, Cell, extract_lab_source,
                                    given_imports, grade_id_for, is_test_cell)

def _error(headline: str, message: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename="TestFailed", evalue=headline,
                        traceback=[headline] + (message.splitlines() if message else []))


class KernelInPipeline(UsageError):
    """The autograde pipeline would run the student's notebook in a kernel."""


def kernel_steps(preprocessors) -> list[str]:
    """The names of the enabled steps among ``preprocessors`` that run a notebook in a
    kernel (nbgrader's Execute and nbconvert's ExecutePreprocessor are nbclient clients)."""
    return [type(p).__name__ for p in preprocessors
            if isinstance(p, NotebookClient) and getattr(p, "enabled", True)]


def _refuse_kernels(preprocessors) -> None:
    found = kernel_steps(preprocessors)
    if found:
        raise KernelInPipeline(
            f"nbgrader's autograde pipeline runs the student's notebook in a kernel "
            f"({', '.join(found)}): that would run student code on the grading machine, "
            "outside the sandbox. Remove it from c.Autograde.autograde_preprocessors "
            "(regenerate nbgrader_config.py with `grader notebooks`); SandboxedGrades "
            "grades the notebook's code in the sandbox instead.")


class SandboxedGrades(NbGraderPreprocessor):
    """Every test cell's outputs from the sandboxed grader's result, no kernel (see the
    module doc). ``course``: the grader's course folder, which ``grader notebooks`` writes
    into nbgrader_config.py (``c.SandboxedGrades.course``)."""

    course = Unicode("", help="the grader's course folder (rubric.yaml, solutions/)").tag(
        config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # nbconvert builds the steps in order before any runs: one before this (a kernel
        # would start before we grade) is refused now; preprocess() checks the whole list.
        _refuse_kernels(self._pipeline())

    def _pipeline(self) -> list:
        return [p for p in getattr(self.parent, "_preprocessors", None) or [] if p is not self]

    def preprocess(self, nb: NotebookNode, resources: dict):
        _refuse_kernels(self._pipeline())
        lab = str(resources.get("nbgrader", {}).get("notebook") or "")
        if not self.course:
            raise UsageError("nbgrader_config.py names no grader course "
                             "(c.SandboxedGrades.course): regenerate it with `grader notebooks`")
        if getattr(self, "_course", None) is None:    # one Course for every notebook
            self._course = Course(self.course)
        course = self._course
        rubric = course.rubric
        outcomes, reason = self._grade(nb, lab, course)
        spec = rubric.labs.get(lab)
        hidden = [grade_id_for(lab, n, t.visibility) for n, t in spec.tests.items()
                  if t.visibility == "hidden"] if spec else []
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if cell.get("cell_type") != "code":
                continue
            if not meta.get("grade") or meta.get("solution"):
                # The student's cells never ran here (nbgrader cleared what was handed in;
                # `--no-execute` keeps it): the notebook holds only the grader's outputs.
                cell.outputs, cell.execution_count = [], None
                continue
            if meta.get("grade_id") == HIDDEN_TESTS_GRADE_ID:
                cell.outputs = _hidden_outputs([outcomes.get(gid) for gid in hidden], reason)
                continue
            outcome = outcomes.get(meta.get("grade_id"))
            if outcome is None:
                headline = "FAILED: not a test of this course's rubric"
                cell.outputs = [_error(headline, reason)]
            elif outcome[0]:
                # stdout only: nbgrader scores a code cell with no error output as passed.
                cell.outputs = [NotebookNode(output_type="stream", name="stdout",
                                             text=f"passed: {outcome[2]} (graded in the "
                                                  "sandbox)\n")]
            else:
                cell.outputs = [_error(f"FAILED (graded in the sandbox): {outcome[2]}",
                                       outcome[1])]
        return nb, resources

    def _grade(self, nb: NotebookNode, lab: str, course: Course) -> tuple[dict, str]:
        """grade_id -> (passed, message, test name), and why a cell may have none."""
        rubric = course.rubric
        spec = rubric.labs.get(lab)
        if spec is None:
            return {}, f"{lab}.ipynb is not one of the rubric's labs"
        cells = [Cell(label=f"code cell {i}", source=_source(c),
                      test=is_test_cell(_source(c), c.get("metadata")))
                 for i, c in enumerate(c for c in nb.cells if c.get("cell_type") == "code")]
        ids = {grade_id_for(lab, name, t.visibility): name for name, t in spec.tests.items()}
        # What a cell may show: a hidden test only by its opaque grade id (never its name).
        shown = {name: name if t.visibility == "public" else "hidden test"
                 for name, t in spec.tests.items()}
        try:
            got = extract_lab_source(cells, name=f"{lab}.ipynb", prelude=given_imports(spec.file, course.solutions),
                                     forbidden=spec.forbidden)
        except NotebookError as exc:
            return {gid: (False, str(exc), shown[name], 0.0) for gid, name in ids.items()}, str(exc)
        visibility = ("public", "hidden") if (course.suites / "hidden" / f"test_{lab}.py").is_file() \
            else ("public",)
        with tempfile.TemporaryDirectory(prefix="grader-nbgrader-") as tmp:
            Path(tmp, spec.file).write_text(got.source, encoding="utf-8")
            with Grader(course, visibility=visibility, graded=True) as grader:
                result = grader.grade(tmp, labs=[lab], name=lab)
        tests = {t.name: t for t in result.lab(lab).tests}
        return {gid: (tests[name].passed, tests[name].message, shown[name], tests[name].score)
                for gid, name in ids.items() if name in tests}, ""


def _hidden_outputs(outcomes: list, reason: str) -> list[NotebookNode]:
    """The outputs of the one cell of all hidden tests: a line per test on stdout, then the
    points of those that passed as the cell's result, which nbgrader takes as the cell's
    partial credit (nbgrader.utils.determine_grade). No error output: that would be 0."""
    if not outcomes or any(o is None for o in outcomes):
        return [_error("FAILED: the hidden tests could not run", reason)]
    lines, earned = [], 0.0
    for k, (passed, message, _, score) in enumerate(outcomes, start=1):
        if passed:
            earned += score
            lines.append(f"passed: hidden test {k} of {len(outcomes)} (graded in the sandbox)")
        else:
            lines.append(f"FAILED: hidden test {k} of {len(outcomes)} (graded in the sandbox)")
            lines += [f"    {ln}" for ln in (message or "").splitlines()]
    return [NotebookNode(output_type="stream", name="stdout", text="\n".join(lines) + "\n"),
            NotebookNode(output_type="execute_result", execution_count=None, metadata={},
                         data={"text/plain": f"{round(earned, 6):g}"})]


def _source(cell) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)
