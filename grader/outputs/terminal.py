"""The terminal table: one rich table per lab, failure messages under each failure."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from grader.results import SubmissionResult


def render_table(result: SubmissionResult, *, console=None, show_passed: bool = True) -> None:
    """A terminal table per lab and test (rich), with failure messages under each failure."""

    console = console or Console()
    for lab in result.labs:
        table = Table(title=f"{lab.name} - {lab.title}: {lab.score:g}/{lab.max_score:g}",
                      title_justify="left", expand=False, show_lines=False)
        table.add_column("test")
        table.add_column("result")
        table.add_column("points", justify="right")
        table.add_column("why", overflow="fold", max_width=90)
        if lab.message:
            console.print(f"[bold]{lab.file}[/bold]: {lab.message}", markup=True, highlight=False)
        for t in lab.tests:
            if t.passed and not show_passed:
                continue
            mark = "[green]pass[/green]" if t.passed else "[red]FAIL[/red]"
            why = "" if t.passed else (t.message + (f"\nDiagnosis: {t.diagnosis}" if t.diagnosis else ""))
            name = t.name + (" (hidden)" if t.visibility == "hidden" else "")
            table.add_row(name, mark, f"{t.score:g}/{t.max_score:g}", escape(why))
        console.print(table)
    console.print(f"[bold]Total: {result.score:g}/{result.max_score:g}[/bold]"
                  f"  ({result.execution_time:.2f} s)")


