"""``nbgrader export``'s grades.csv, safe to open in a spreadsheet.

nbgrader's own CSV exporter writes every value as it is, unquoted: a student id taken from a
``submitted/<student>/`` folder name such as ``=HYPERLINK("http://x.example","click")`` is a
live formula in the instructor's spreadsheet, and one with a comma shifts the row. The
course's ``nbgrader_config.py`` makes ``SafeCsvExport`` the exporter
(``c.ExportApp.plugin_class``): the same columns and rows as nbgrader's, written through
``grader.outputs.spreadsheet`` (text cells quoted and neutralised, numbers bare).
"""

from __future__ import annotations

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins.export import CsvExportPlugin

from grader.outputs import spreadsheet
from grader.outputs.atomic import atomic_open

COLUMNS = ("assignment", "duedate", "timestamp", "student_id", "last_name", "first_name",
           "email", "raw_score", "late_submission_penalty", "score", "max_score")
NUMBERS = ("raw_score", "late_submission_penalty", "score", "max_score")


class SafeCsvExport(CsvExportPlugin):
    """nbgrader's CSV export (same options: ``--to``, ``--student``, ``--assignment``), every
    cell safe to open in a spreadsheet."""

    def export(self, gradebook: Gradebook) -> None:
        dest = self.to or "grades.csv"
        students = {str(s) for s in self.student}
        assignments = {str(a) for a in self.assignment}
        self.log.info("Exporting grades to %s (spreadsheet-safe cells)", dest)
        with atomic_open(dest, "w", encoding="utf-8", newline="") as fh:
            writer = spreadsheet.writer(fh)
            writer.writerow(COLUMNS)
            for assignment in gradebook.assignments:
                if assignments and assignment.name not in assignments:
                    continue
                for student in gradebook.students:
                    if students and student.id not in students:
                        continue
                    writer.writerow(_row(gradebook, assignment, student))


def _row(gradebook: Gradebook, assignment, student) -> list:
    """One line, as nbgrader's exporter computes it: a missing submission scores 0."""
    row = {"assignment": assignment.name, "duedate": assignment.duedate,
           "student_id": student.id, "last_name": student.last_name,
           "first_name": student.first_name, "email": student.email,
           "max_score": assignment.max_score}
    try:
        submission = gradebook.find_submission(assignment.name, student.id)
    except MissingEntry:
        row.update(timestamp="", raw_score=0.0, late_submission_penalty=0.0, score=0.0)
    else:
        penalty = submission.late_submission_penalty or 0.0
        row.update(timestamp=submission.timestamp, raw_score=submission.score,
                   late_submission_penalty=penalty,
                   score=max(0.0, submission.score - penalty))
    return [spreadsheet.number_cell(row[c] or 0.0) if c in NUMBERS
            else ("" if row[c] is None else str(row[c])) for c in COLUMNS]
