"""The class gradebook: grades.csv, summary.json, plots and the class dashboard (class.html,
``grader.outputs.class_page``), rebuilt from per-student results.

``build_gradebook`` reads ``OUT/<student>/results.json`` (the Gradescope file that ``grader
grade`` and ``grader batch`` write) one student at a time and keeps only a small row, the
dashboard's small record and some counters per student, so a class of any size fits in
memory. Every file is written
atomically: a killed batch leaves the previous gradebook or the new one, never half of one.
Nothing here depends on timings, so two runs over the same submissions give the same bytes.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from grader.outputs.atomic import atomic_open, atomic_write_text
from grader.outputs.class_page import ClassView, labs_of, student_record
from grader.outputs.class_page import write_class_page
from grader.outputs import spreadsheet
from grader.results import (Fault, LabResult, LabStatus, SubmissionResult, TestResult,
                            is_grader_fault, read_fault)
from grader.rubric import Rubric

HISTOGRAM_BINS = 20            # bins below the maximum, at most (full marks get one more)
POINT_DECIMALS = 2           # points in summary.json (means, medians, edges): 63.33, not 63.3333
RATE_DECIMALS = 4            # pass rates, fractions of the class: 0.8333 (83.33%)
# What build_gradebook writes into OUT (a student may not have one of these names).
GRADEBOOK_FILES = ("grades.csv", "summary.json", "score_histogram.png", "test_pass_rates.png",
                   "class.html", "similarity.json", "similarity.csv")
NOT_GRADED = "not graded (the batch stopped before this student; run it again)"


@dataclass
class Row:
    """One line of grades.csv."""
    student: str
    labs: dict[str, float]        # lab module name -> points
    total: float
    max_total: float
    status: str                   # "ok", or why grading failed (for people)
    fault: Fault | None = None    # whose doing it is that it was not graded; None: it was


@dataclass
class Gradebook:
    """What ``build_gradebook`` wrote, and the numbers that the summary holds."""
    rows: int
    not_ok: int
    summary: dict
    files: dict[str, Path] = field(default_factory=dict)


def failed_result(student: str, rubric: Rubric, reason: str, fault: Fault) -> SubmissionResult:
    """A zero-point result for a submission that could not be graded, saying why (``reason``,
    for people) and by whose doing (``fault``, what every output reads).

    Every rubric test is listed (failed, with the reason), so the student's results.json and
    gradebook row have the same shape and maximum as a graded one.
    """
    result = SubmissionResult(submission=student, status=reason, fault=fault)
    for lab in rubric.labs.values():
        lab_result = LabResult(name=lab.name, title=lab.title, file=lab.file,
                               status=LabStatus.ERROR, message=reason, fault=fault)
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
               max_total=max_total, status=str(extra.get("status", "ok")),
               fault=read_fault(extra))


def status_text(row: Row, data: dict | None, lab_names: list[str]) -> str:
    """What grades.csv's status column says: "ok" only when every lab was graded; else
    why not (the submission's status, or each lab that could not be graded and why)."""
    if row.fault is not None or data is None:
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


def number(x: float) -> int | float:
    """Points as the CSV shows them: 12 rather than 12.0, at most 4 decimals (a number
    cell, written unquoted: grader.outputs.spreadsheet)."""
    return spreadsheet.number_cell(x)


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
        if row.fault is not None or data is None:
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


def histogram_step(max_total: float) -> float:
    """The width of the histogram's bins: whole points (1, 2, 5, 10, 25, 50, 100, ...), at
    most HISTOGRAM_BINS bins below the maximum (bins of 5 for 100 points)."""
    for step in (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000):
        if max_total / step <= HISTOGRAM_BINS:
            return step
    return -(-max_total // HISTOGRAM_BINS)


def score_distribution(totals: list[float], max_total: float) -> dict:
    """Mean, median, min, max and a histogram of the totals.

    The histogram's bins are [0, w), [w, 2w), ... up to the maximum (w from
    ``histogram_step``: whole points), and a last bin for full marks alone: its two edges
    are both the maximum. So a 91 and a 100 are never counted together."""
    if max_total > 0:
        step = histogram_step(max_total)
        below = int(-(-max_total // step))                  # bins under the maximum
        edges = [round(min(i * step, max_total), POINT_DECIMALS) for i in range(below + 1)]
    else:
        step, below, edges = 1, 0, [0.0]
    edges.append(edges[-1])                                 # full marks: a bin of its own
    counts = [0] * (below + 1)
    for t in totals:
        i = below if t >= max_total else min(max(int(t // step), 0), below - 1)
        counts[i] += 1
    hist = {"bin_edges": edges, "counts": counts}
    if not totals:
        return {"mean": None, "median": None, "min": None, "max": None, "histogram": hist}
    return {"mean": round(statistics.fmean(totals), POINT_DECIMALS),
            "median": round(statistics.median(totals), POINT_DECIMALS),
            "min": round(min(totals), POINT_DECIMALS), "max": round(max(totals), POINT_DECIMALS),
            "histogram": hist}


def build_gradebook(*, out: Path, students: list[str], rubric: Rubric,
                    plots: bool = True, similarity: dict | None = None) -> Gradebook:
    """Write grades.csv, summary.json, the plots and the class dashboard (class.html,
    ``grader.outputs.class_page``) from ``out/<student>/results.json``.

    ``students`` fixes the rows and their order; a student without a readable results.json
    gets a zero row whose status says so. ``similarity``: the batch's similarity report
    for class.html (default: ``out/similarity.json`` when there is one).
    """
    out = Path(out)
    lab_names = list(rubric.labs)
    tally = _Tally(rubric)
    not_ok = 0
    records = []                  # the dashboard's, one small record per student
    # backslashreplace: a student id that is not valid UTF-8 (a raw file name) stays readable
    with atomic_open(out / "grades.csv", "w", encoding="utf-8", errors="backslashreplace",
                     newline="") as fh:
        # Every text cell (student ids come from folder and zip names) made safe to open in
        # a spreadsheet, numbers left numbers (grader.outputs.spreadsheet).
        writer = spreadsheet.writer(fh)
        writer.writerow(["student", *lab_names, "total", "max_total", "status"])
        for student in students:
            data = read_results(out / student / "results.json")
            if data is None:
                row = Row(student, {lab: 0.0 for lab in lab_names}, 0.0, rubric.max_points,
                          NOT_GRADED, Fault.GRADER)
            else:
                row = row_from_results(student, data, lab_names)
            not_ok += row.fault is not None
            tally.add(row, data)
            records.append(student_record(
                student, data, has_feedback=(out / student / "feedback.html").is_file(),
                max_total=rubric.max_points, missing=NOT_GRADED))
            writer.writerow([row.student, *(number(row.labs[lab]) for lab in lab_names),
                             number(row.total), number(row.max_total),
                             status_text(row, data, lab_names)])
    summary = tally.summary()
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    files = {"grades_csv": out / "grades.csv", "summary_json": out / "summary.json"}
    counted = [r.total for r in records if not is_grader_fault(r.fault)]
    files["class_html"] = write_class_page(ClassView(
        labs=labs_of(rubric), students=records, max_total=rubric.max_points,
        score=score_distribution(counted, rubric.max_points),
        similarity=similarity if similarity is not None else _similarity_report(out)),
        out / "class.html")
    if plots:
        files["score_histogram"] = plot_score_histogram(summary, out / "score_histogram.png")
        files["test_pass_rates"] = plot_test_pass_rates(summary, out / "test_pass_rates.png")
    return Gradebook(rows=len(students), not_ok=not_ok, summary=summary, files=files)


def _similarity_report(out: Path) -> dict | None:
    """The similarity.json a batch wrote (grader.batch.integrity), or None."""
    try:
        data = json.loads((out / "similarity.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("labs"), dict) else None


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


def score_histogram_figure(summary: dict):
    """The histogram of the total scores (the summary's): bins of whole points, full marks
    in a bar of its own (set apart, in another colour), each bar's count written on it."""
    hist = summary["score"]["histogram"]
    edges, counts = hist["bin_edges"], hist["counts"]
    max_total = float(summary["max_total"])
    step = histogram_step(max_total) if max_total > 0 else 1
    fig = _figure(8, 4.2)
    ax = fig.add_subplot()
    below = len(counts) - 1
    lefts = edges[:below]
    widths = [b - a for a, b in zip(edges[:below], edges[1:below + 1], strict=True)]
    full_x = max_total + 0.4 * step
    bars = list(ax.bar(lefts, counts[:below], width=widths, align="edge", edgecolor="black",
                       color="#4c72b0", label="scores"))
    bars += list(ax.bar([full_x], [counts[-1]], width=step, align="edge", edgecolor="black",
                        color="#55a868", label="full marks"))
    for bar, count in zip(bars, counts, strict=True):
        if count:
            ax.annotate(str(count), xy=(bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                        fontsize=9)
    ax.set_xlabel(f"total score (out of {number(max_total)}; bins of {number(step)})")
    ax.set_ylabel("students")
    from matplotlib.ticker import MaxNLocator
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, max(counts + [1]) * 1.15 + 0.5)          # room for the counts
    tick_step = step * max(1, round(below / 10))
    ticks = [x for x in edges[:below] if round(x / tick_step, 6) == int(x / tick_step)]
    ax.set_xticks(ticks + [full_x + step / 2],
                  [number(x) for x in ticks] + [f"{number(max_total)}\n(full)"])
    ax.set_xlim(0, full_x + 1.4 * step)
    score = summary["score"]
    if score["mean"] is not None:
        ax.set_title(f"{summary['students']} students: mean {score['mean']:.1f}, "
                     f"median {score['median']:g}")
    return fig


def plot_score_histogram(summary: dict, path: Path) -> Path:
    """score_histogram.png (see ``score_histogram_figure``)."""
    return _save_png(score_histogram_figure(summary), path)


PASS_RATE_ROW_IN = 0.3        # inches of figure height per test (9-point labels, no overlap)


def pass_rates_figure(summary: dict):
    """Horizontal bars: the share of graded students who passed each test, one colour per
    lab, each bar with its percentage; the figure as tall as its tests need."""
    tests = list(summary["tests"].values())
    fig = _figure(10, max(2.5, PASS_RATE_ROW_IN * len(tests) + 1.6))
    ax = fig.add_subplot()
    labels = [t["test"] + (" (hidden)" if t["visibility"] == "hidden" else "") for t in tests]
    rates = [None if t["pass_rate"] is None else 100 * t["pass_rate"] for t in tests]
    labs = list(dict.fromkeys(t["lab"] for t in tests))
    palette = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
    ys = list(range(len(tests)))[::-1]      # first test at the top
    for i, lab in enumerate(labs):          # one colour (and legend entry) per lab
        rows = [k for k, t in enumerate(tests) if t["lab"] == lab]
        ax.barh([ys[k] for k in rows], [rates[k] or 0.0 for k in rows], height=0.7,
                color=palette[i % len(palette)], label=lab)
    for y, rate in zip(ys, rates, strict=True):
        ax.annotate("n/a" if rate is None else f"{rate:.0f}%", xy=(rate or 0.0, y),
                    xytext=(3, 0), textcoords="offset points", ha="left", va="center",
                    fontsize=8)
    ax.set_yticks(ys, labels, fontsize=9)
    ax.set_ylim(-0.6, len(tests) - 0.4)
    if labs:   # above the bars, never over them
        ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=min(4, len(labs)),
                  fontsize=9, frameon=False)
    ax.set_xlim(0, 112)                     # room for "100%"
    ax.set_xticks(range(0, 101, 20))
    ax.set_xlabel(f"passed (% of the {summary['graded_ok']} graded students)")
    ax.set_title("Pass rate per test", loc="left", pad=26 if labs else 6)
    ax.grid(axis="x", color="#dddddd")
    ax.set_axisbelow(True)
    return fig


def plot_test_pass_rates(summary: dict, path: Path) -> Path:
    """test_pass_rates.png (see ``pass_rates_figure``)."""
    return _save_png(pass_rates_figure(summary), path)
