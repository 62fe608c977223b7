"""The terminal table: one rich table per lab, failure messages under each failure; a
diagnosis that several failed tests of a lab share is printed once, above its table."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from grader.outputs.text import (cause_of, handed_in_text, missing_lab_line, not_handed_in,
                                 shared_causes)
from grader.results import SubmissionResult


LOG_WIDTH = 200     # columns when printing to a log or a pipe: test names are never cut


def _sized() -> bool:
    """The output has a width of its own: a terminal, or COLUMNS set (rich reads it);
    otherwise rich assumes 80 columns and cuts long test names."""
    return bool(os.environ.get("COLUMNS")) or sys.stdout.isatty()


def render_table(result: SubmissionResult, *, console=None, show_passed: bool = True,
                 waited_s: float | None = None) -> None:
    """A terminal table per lab and test (rich), with failure messages under each failure.
    The lab headings, the points column and the Total line count points (the rubric's
    weights), never tests (``grader check``'s last lines count tests).
    The Total line's time is ``waited_s`` (the command's wall time so far) where given,
    else the grading's own execution time."""

    console = console or Console(width=None if _sized() else LOG_WIDTH)
    for lab in result.labs:
        if not_handed_in(lab):      # one line, not a row per test of a file that is not there
            console.print(missing_lab_line(lab), markup=False, highlight=False)
            continue
        causes = shared_causes(lab)
        heading = f"{lab.name} - {lab.title}: {lab.score:g}/{lab.max_score:g} points"
        table = Table(title=None if causes else heading, title_justify="left", expand=False,
                      show_lines=False)
        table.add_column("test", no_wrap=True)
        table.add_column("result")
        table.add_column("points", justify="right")
        table.add_column("why", overflow="fold", max_width=90)
        if causes:                 # the lab's heading above its likely causes, not the table
            console.print(heading, style="italic", markup=False, highlight=False)
        if lab.message:
            console.print(f"[bold]{lab.file}[/bold]: {lab.message}", markup=True, highlight=False)
        for cause in causes:       # written out once, above the table; each test refers to it
            console.print(cause.summary(), markup=False, highlight=False)
        for t in lab.tests:
            if t.passed and not show_passed:
                continue
            mark = ("[green]pass[/green]" if t.passed else
                    "[yellow]later[/yellow]" if t.deferred else "[red]FAIL[/red]")
            cause = cause_of(t, causes)
            diagnosis = cause.reference() if cause else (
                f"Diagnosis: {t.diagnosis}" if t.diagnosis else "")
            why = t.message if t.passed else "\n".join(x for x in (t.message, diagnosis) if x)
            name = t.name + (" (hidden)" if t.visibility == "hidden" else "")
            points = f"-/{t.max_score:g}" if t.deferred else f"{t.score:g}/{t.max_score:g}"
            table.add_row(name, mark, points, escape(why))
        console.print(table)
    covered = handed_in_text(result)
    console.print(f"[bold]Total: {result.score:g}/{result.max_score:g} points[/bold]"
                  f"  ({result.execution_time if waited_s is None else waited_s:.2f} s)" + (f"  {escape(covered)}" if covered else ""))


