"""The class gradebook: grades.csv, summary.json and plots, rebuilt from per-student results.

``build_gradebook`` reads ``OUT/<student>/results.json`` (the Gradescope file that ``grader
grade`` and ``grader batch`` write) one student at a time and keeps only a small row and
some counters per student, so a class of any size fits in memory. Every file is written
atomically: a killed batch leaves the previous gradebook or the new one, never half of one.
Nothing here depends on timings, so two runs over the same submissions give the same bytes.
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from grader.outputs.atomic import atomic_open, atomic_write_text
from grader.results import LabResult, SubmissionResult, TestResult
from grader.rubric import Rubric

HISTOGRAM_BINS = 10
POINT_DECIMALS = 2           # points in summary.json (means, medians, edges): 63.33, not 63.3333
RATE_DECIMALS = 4            # pass rates, fractions of the class: 0.8333 (83.33%)
# What build_gradebook writes into OUT (a student may not have one of these names).
GRADEBOOK_FILES = ("grades.csv", "summary.json", "score_histogram.png", "test_pass_rates.png")
NOT_GRADED = "not graded (the batch stopped before this student; run it again)"


@dataclass
class Row:
    """One line of grades.csv."""
    student: str
    labs: dict[str, float]        # lab module name -> points
    total: float
    max_total: float
    status: str                   # "ok", or why grading failed


@dataclass
class Gradebook:
    """What ``build_gradebook`` wrote, and the numbers that the summary holds."""
    rows: int
    not_ok: int
    summary: dict
    files: dict[str, Path] = field(default_factory=dict)


def failed_result(student: str, rubric: Rubric, reason: str) -> SubmissionResult:
    """A zero-point result for a submission that could not be graded, saying why.

    Every rubric test is listed (failed, with the reason), so the student's results.json and
    gradebook row have the same shape and maximum as a graded one.
    """
    result = SubmissionResult(submission=student, status=reason)
    for lab in rubric.labs.values():
        lab_result = LabResult(name=lab.name, title=lab.title, file=lab.file, status="error",
                               message=reason)
        for test in lab.tests.values():
            lab_result.tests.append(TestResult(
                lab=lab.name, name=test.name, description="", visibility=test.visibility,
                max_score=test.points, passed=False, message=reason))
        result.labs.append(lab_result)
    return result


def row_from_results(student: str, data: dict, lab_names: list[str]) -> Row:
    """The gradebook row of one student's results.json (Gradescope format)."""
    extra = data.get("extra_data") or {}
    labs = extra.get("labs") or {}
    points = {lab: float((labs.get(lab) or {}).get("score", 0.0)) for lab in lab_names}
    max_total = sum(float(t.get("max_score", 0.0)) for t in data.get("tests", []))
    return Row(student=student, labs=points, total=float(data.get("score", 0.0)),
               max_total=max_total, status=str(extra.get("status", "ok")))


def status_text(row: Row, data: dict | None, lab_names: list[str]) -> str:
    """What grades.csv's status column says: "ok" only when every lab was graded; else
    why not (the submission's status, or each lab that could not be graded and why)."""
    if row.status != "ok" or data is None:
        return row.status
    labs = (data.get("extra_data") or {}).get("labs") or {}
    problems = [f"{lab}: {(labs.get(lab) or {}).get('status', 'missing')}" for lab in lab_names
                if (labs.get(lab) or {}).get("status", "missing") != "graded"]
    return "; ".join(problems) or "ok"


def read_results(path: Path) -> dict | None:
    """A results.json as a dict, or None when it is missing or unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("tests"), list) else None


def number(x: float) -> str:
    """Points as the CSV shows them: 12 rather than 12.0, at most 4 decimals."""
    x = round(float(x), 4)
    return str(int(x)) if x == int(x) else repr(x)


class _Tally:
    """Per-test and per-lab counters, and one total per student (for the median)."""

    def __init__(self, rubric: Rubric):
        self.rubric = rubric
        self.totals: list[float] = []          # one float per student, for the median
        self.statuses: dict[str, int] = {}
        self.lab_points: dict[str, float] = {lab: 0.0 for lab in rubric.labs}
        self.lab_statuses: dict[str, dict[str, int]] = {lab: {} for lab in rubric.labs}
        self.passed: dict[str, int] = {}       # "lab: test" -> students who passed it
        self.graded = 0                        # students whose status is ok

    def add(self, row: Row, data: dict | None) -> None:
        self.totals.append(row.total)
        self.statuses[row.status] = self.statuses.get(row.status, 0) + 1
        for lab, points in row.labs.items():
            self.lab_points[lab] += points
        if row.status != "ok" or data is None:
            return
        self.graded += 1
        labs = (data.get("extra_data") or {}).get("labs") or {}
        for lab in self.rubric.labs:
            status = str((labs.get(lab) or {}).get("status", "missing"))
            self.lab_statuses[lab][status] = self.lab_statuses[lab].get(status, 0) + 1
        for test in data.get("tests", []):
            if test.get("status") == "passed":
                name = str(test.get("name"))
                self.passed[name] = self.passed.get(name, 0) + 1

    def summary(self) -> dict:
        n = len(self.totals)
        max_total = self.rubric.max_points
        tests = {}
        for lab in self.rubric.labs.values():
            for test in lab.tests.values():
                name = f"{lab.name}: {test.name}"
                passed = self.passed.get(name, 0)
                tests[name] = {"lab": lab.name, "test": test.name, "points": test.points,
                               "visibility": test.visibility, "passed": passed,
                               "pass_rate": (round(passed / self.graded, RATE_DECIMALS)
                                             if self.graded else None)}
        return {
            "students": n,
            "graded_ok": self.graded,
            "not_ok": n - self.graded,
            "statuses": dict(sorted(self.statuses.items())),
            "max_total": max_total,
            "score": score_distribution(self.totals, max_total),
            "labs": {lab: {"max_points": spec.max_points,
                           "mean": (round(self.lab_points[lab] / n, POINT_DECIMALS)
                                    if n else None),
                           "statuses": dict(sorted(self.lab_statuses[lab].items()))}
                     for lab, spec in self.rubric.labs.items()},
            "tests": tests,
        }


def score_distribution(totals: list[float], max_total: float) -> dict:
    """Mean, median, min, max and a HISTOGRAM_BINS-bin histogram over [0, max_total]."""
    edges = [round(max_total * i / HISTOGRAM_BINS, POINT_DECIMALS)
             for i in range(HISTOGRAM_BINS + 1)]
    counts = [0] * HISTOGRAM_BINS
    for t in totals:
        i = int(t / max_total * HISTOGRAM_BINS) if max_total > 0 else 0
        counts[min(max(i, 0), HISTOGRAM_BINS - 1)] += 1   # the top edge belongs to the last bin
    if not totals:
        return {"mean": None, "median": None, "min": None, "max": None,
                "histogram": {"bin_edges": edges, "counts": counts}}
    return {"mean": round(statistics.fmean(totals), POINT_DECIMALS),
            "median": round(statistics.median(totals), POINT_DECIMALS),
            "min": round(min(totals), POINT_DECIMALS), "max": round(max(totals), POINT_DECIMALS),
            "histogram": {"bin_edges": edges, "counts": counts}}


def build_gradebook(*, out: Path, students: list[str], rubric: Rubric,
                    plots: bool = True) -> Gradebook:
    """Write grades.csv, summary.json and the plots from ``out/<student>/results.json``.

    ``students`` fixes the rows and their order; a student without a readable results.json
    gets a zero row whose status says so.
    """
    out = Path(out)
    lab_names = list(rubric.labs)
    tally = _Tally(rubric)
    not_ok = 0
    # backslashreplace: a student id that is not valid UTF-8 (a raw file name) stays readable
    with atomic_open(out / "grades.csv", "w", encoding="utf-8", errors="backslashreplace",
                     newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["student", *lab_names, "total", "max_total", "status"])
        for student in students:
            data = read_results(out / student / "results.json")
            if data is None:
                row = Row(student, {lab: 0.0 for lab in lab_names}, 0.0, rubric.max_points,
                          NOT_GRADED)
            else:
                row = row_from_results(student, data, lab_names)
            not_ok += row.status != "ok"
            tally.add(row, data)
            writer.writerow([row.student, *(number(row.labs[lab]) for lab in lab_names),
                             number(row.total), number(row.max_total),
                             status_text(row, data, lab_names)])
    summary = tally.summary()
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    files = {"grades_csv": out / "grades.csv", "summary_json": out / "summary.json"}
    if plots:
        files["score_histogram"] = plot_score_histogram(summary, out / "score_histogram.png")
        files["test_pass_rates"] = plot_test_pass_rates(summary, out / "test_pass_rates.png")
    return Gradebook(rows=len(students), not_ok=not_ok, summary=summary, files=files)


# ------------------------------------------------------------------------------ plots

def _figure(width: float, height: float):
    # The object API with an Agg canvas: no pyplot global state, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save_png(fig, path: Path) -> Path:
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png", bbox_inches="tight")
    return path


def plot_score_histogram(summary: dict, path: Path) -> Path:
    """Bar chart of the total scores (the summary's histogram)."""
    hist = summary["score"]["histogram"]
    edges, counts = hist["bin_edges"], hist["counts"]
    fig = _figure(7, 4)
    ax = fig.add_subplot()
    widths = [b - a for a, b in zip(edges, edges[1:], strict=False)]
    ax.bar(edges[:-1], counts, width=widths, align="edge", edgecolor="black", color="#4c72b0")
    ax.set_xlabel(f"total score (out of {number(summary['max_total'])})")
    ax.set_ylabel("students")
    from matplotlib.ticker import MaxNLocator
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    score = summary["score"]
    if score["mean"] is not None:
        ax.set_title(f"{summary['students']} students: mean {score['mean']:.1f}, "
                     f"median {score['median']:g}")
    ax.set_xlim(edges[0], edges[-1] if edges[-1] > edges[0] else 1)
    return _save_png(fig, path)


def plot_test_pass_rates(summary: dict, path: Path) -> Path:
    """Horizontal bars: the share of graded students who passed each test, grouped by lab."""
    tests = list(summary["tests"].values())
    fig = _figure(9, max(2.5, 0.28 * len(tests) + 1.2))
    ax = fig.add_subplot()
    labels = [t["test"] + (" (hidden)" if t["visibility"] == "hidden" else "") for t in tests]
    rates = [100 * (t["pass_rate"] or 0.0) for t in tests]
    labs = list(dict.fromkeys(t["lab"] for t in tests))
    palette = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
    ys = list(range(len(tests)))[::-1]      # first test at the top
    for i, lab in enumerate(labs):          # one colour (and legend entry) per lab
        rows = [k for k, t in enumerate(tests) if t["lab"] == lab]
        ax.barh([ys[k] for k in rows], [rates[k] for k in rows],
                color=palette[i % len(palette)], label=lab)
    ax.set_yticks(ys, labels, fontsize=7)
    if labs:
        ax.legend(loc="lower right", fontsize=7)
    ax.set_xlim(0, 100)
    ax.set_xlabel(f"passed (% of the {summary['graded_ok']} graded students)")
    ax.set_title("Pass rate per test")
    return _save_png(fig, path)
