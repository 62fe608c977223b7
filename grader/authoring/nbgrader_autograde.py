"""``nbgrader autograde``'s grades from the sandboxed grader, not from the student's kernel.

A notebook's test cells call ``grader.notebooks.check`` in the kernel that ran the student's
code, and whatever the student's code did to that kernel (``sys.modules``, builtins,
IPython's hooks) decides what those cells print: left to nbgrader, the points would depend
on code running in the student's kernel. ``SandboxedGrades`` is an nbgrader preprocessor that
``grader notebooks`` puts into the course's autograde pipeline, after the notebook ran and
before nbgrader saves the grades. In nbgrader's own (trusted) process it grades the notebook's
code with ``grading.Grader`` (student code only in sandbox workers), and sets every test
cell's outputs from that result: a "passed" line on stdout for a pass, an error output with the grader's
message for a failure; the one cell of all hidden tests gets a line per test and, as its
result, the points of those that passed (nbgrader's partial credit). nbgrader then scores each
test cell from those outputs, as always.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

from grader import paths
from grader.errors import NotebookError
from grader.grading import Grader
from grader.intake.notebook import (HIDDEN_TESTS_GRADE_ID, Cell, extract_lab_source,
                                    given_imports, grade_id_for, is_test_cell)
from grader.rubric import load_rubric

def _error(headline: str, message: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename="TestFailed", evalue=headline,
                        traceback=[headline] + (message.splitlines() if message else []))


class SandboxedGrades(NbGraderPreprocessor):
    """Every test cell's outputs from the sandboxed grader's result (see the module doc)."""

    def preprocess(self, nb: NotebookNode, resources: dict):
        lab = str(resources.get("nbgrader", {}).get("notebook") or "")
        rubric = load_rubric(paths.RUBRIC)
        outcomes, reason = self._grade(nb, lab, rubric)
        spec = rubric.labs.get(lab)
        hidden = [grade_id_for(lab, n, t.visibility) for n, t in spec.tests.items()
                  if t.visibility == "hidden"] if spec else []
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if cell.get("cell_type") != "code" or not meta.get("grade") or meta.get("solution"):
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

    def _grade(self, nb: NotebookNode, lab: str, rubric) -> tuple[dict, str]:
        """grade_id -> (passed, message, test name), and why a cell may have none."""
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
            got = extract_lab_source(cells, name=f"{lab}.ipynb", prelude=given_imports(spec.file),
                                     forbidden=spec.forbidden)
        except NotebookError as exc:
            return {gid: (False, str(exc), shown[name], 0.0) for gid, name in ids.items()}, str(exc)
        visibility = ("public", "hidden") if (paths.SUITES / "hidden" / f"test_{lab}.py").is_file() \
            else ("public",)
        with tempfile.TemporaryDirectory(prefix="grader-nbgrader-") as tmp:
            Path(tmp, spec.file).write_text(got.source, encoding="utf-8")
            with Grader(rubric, visibility=visibility) as grader:
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
