"""The terminal table: one rich table per lab, failure messages under each failure; a
diagnosis that several failed tests of a lab share is printed once, above its table."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from grader.outputs.text import cause_of, shared_causes
from grader.results import SubmissionResult


def render_table(result: SubmissionResult, *, console=None, show_passed: bool = True) -> None:
    """A terminal table per lab and test (rich), with failure messages under each failure."""

    console = console or Console()
    for lab in result.labs:
        causes = shared_causes(lab)
        heading = f"{lab.name} - {lab.title}: {lab.score:g}/{lab.max_score:g}"
        table = Table(title=None if causes else heading, title_justify="left", expand=False,
                      show_lines=False)
        table.add_column("test")
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
            mark = "[green]pass[/green]" if t.passed else "[red]FAIL[/red]"
            cause = cause_of(t, causes)
            diagnosis = cause.reference() if cause else (
                f"Diagnosis: {t.diagnosis}" if t.diagnosis else "")
            why = t.message if t.passed else "\n".join(x for x in (t.message, diagnosis) if x)
            name = t.name + (" (hidden)" if t.visibility == "hidden" else "")
            table.add_row(name, mark, f"{t.score:g}/{t.max_score:g}", escape(why))
        console.print(table)
    console.print(f"[bold]Total: {result.score:g}/{result.max_score:g}[/bold]"
                  f"  ({result.execution_time:.2f} s)")


