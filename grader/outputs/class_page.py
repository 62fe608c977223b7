"""The class dashboard, ``DIR/class.html``: one self-contained page for the instructor.

Written by every batch, from the same pass over the students' ``results.json`` that builds
the gradebook (``grader.outputs.gradebook.build_gradebook`` calls ``write_class_page``).
Plain data in (``ClassView``: the labs and tests, one small ``StudentRecord`` per student,
the score distribution), HTML out. It shows:

- the score distribution (an inline SVG histogram, the bins of summary.json);
- the most common diagnosed mistakes across the class ("31% of students (4 of 13): softmax
  over the wrong axis"), each with its hint, the tests it showed in and the students
  concerned, linked to their feedback.html;
- pass rates per lab (full marks) and per test, public and hidden;
- the students whose submission the grader failed to grade, apart: they are no score, and
  a rerun of the batch grades them again; and submissions that could not be graded (a
  rejected zip), which are real zeros;
- every student, linked to their feedback.html;
- the similarity report (``grader.batch.integrity``), per lab: the pairs of students at or
  above its threshold with their shared fraction, each student found close to the course's
  solutions or a past one, and the top pairs side by side with the shared lines marked.
  Evidence for the instructor, never a grade change; no student's file holds any of it.

The page is static (no script) and fetches nothing. Student ids are untrusted text (a
folder may be named ``<script>``): every text is made printable and HTML-escaped, and a
link is the id percent-encoded from its raw bytes. No timings: two runs over the same
results give the same bytes. The page names hidden tests: it is for the instructor only,
and says so at the top.
"""

from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from grader.outputs.atomic import atomic_write_text
from grader.outputs.text import diagnosis_name, printable
from grader.results import Fault, is_grader_fault, read_fault
from grader.rubric import Rubric

# Where a results.json written before diagnoses were recorded as data names them
# (grader.outputs.gradescope._output_text): the full form, or the short reference.
_OLD_DIAGNOSIS = re.compile(r"^Diagnosis: (.*?)(?: \((?:seen in \d+ tests of|the hint is in) "
                            r"[^()]*\))?$", re.M)


@dataclass(frozen=True)
class TestInfo:
    """One rubric test."""
    __test__ = False  # not a pytest test class

    lab: str
    name: str
    visibility: str               # public | hidden
    points: float


@dataclass(frozen=True)
class LabInfo:
    """One lab of the batch, with its tests in rubric order."""
    name: str                     # module name, e.g. lab1_attention
    title: str
    tests: tuple[TestInfo, ...]

    @property
    def max_points(self) -> float:
        return float(sum(t.points for t in self.tests))


@dataclass(frozen=True)
class StudentRecord:
    """What the page needs of one student (from their results.json)."""
    student: str
    status: str                   # "ok", or why the submission was not graded (for people)
    total: float
    max_total: float
    labs: dict[str, float]        # lab -> points
    lab_statuses: dict[str, str]  # lab -> graded | missing | import_error | forbidden_api | error
    passed: frozenset[str]        # "lab: test" of every test passed
    diagnoses: tuple[tuple[str, str, str], ...]   # (lab, test, "<name>: <hint>") of failed tests
    has_feedback: bool            # DIR/<student>/feedback.html exists
    fault: Fault | None = None    # whose doing it is that it was not graded; None: it was


@dataclass(frozen=True)
class ClassView:
    """The whole page's data."""
    labs: list[LabInfo]
    students: list[StudentRecord]     # in gradebook order (by id)
    max_total: float
    score: dict                       # score_distribution() of the totals, grader faults left out
    similarity: dict | None = None    # the batch's similarity report (similarity.json), if any


def labs_of(rubric: Rubric) -> list[LabInfo]:
    """The rubric's labs and tests, as the page shows them."""
    return [LabInfo(lab.name, lab.title,
                    tuple(TestInfo(lab.name, t.name, t.visibility, t.points)
                          for t in lab.tests.values()))
            for lab in rubric.labs.values()]


def _diagnosis_in_output(test: dict) -> str:
    found = _OLD_DIAGNOSIS.search(str(test.get("output") or ""))
    return found.group(1) if found else ""


def _diagnoses(data: dict, labs: dict) -> list[tuple[str, str, str]]:
    """(lab, test, "<name>: <hint>") of every failed test with a diagnosis: from each lab's
    ``mistakes`` (grader.outputs.gradescope.lab_mistakes), or, in a results.json written
    before those were kept, from the tests' outputs."""
    found = []
    for lab, entry in labs.items():
        for name, mistake in ((entry or {}).get("mistakes") or {}).items():
            hint = str((mistake or {}).get("hint") or "")
            for test in (mistake or {}).get("tests") or []:
                found.append((lab, str(test), f"{name}: {hint}" if hint else str(name)))
    old = {lab for lab, entry in labs.items() if "mistakes" not in (entry or {})}
    for test in data.get("tests", []):
        lab, _, name = str(test.get("name", "")).partition(": ")
        if lab in old and name and test.get("status") != "passed" \
                and (diagnosis := _diagnosis_in_output(test)):
            found.append((lab, name, diagnosis))
    return found


def student_record(student: str, data: dict | None, *, has_feedback: bool,
                   max_total: float = 0.0, missing: str = "not graded") -> StudentRecord:
    """The record of one student's results.json (Gradescope format, as the batch writes it);
    ``data`` None (no readable results.json): not graded (the batch stopped first: the
    grader's doing), status ``missing``."""
    if data is None:
        return StudentRecord(student, missing, 0.0, max_total, {}, {}, frozenset(), (),
                             has_feedback, Fault.GRADER)
    extra = data.get("extra_data") or {}
    labs = extra.get("labs") or {}
    return StudentRecord(
        student=student, status=str(extra.get("status", "ok")),
        total=float(data.get("score", 0.0)),
        max_total=sum(float(t.get("max_score", 0.0)) for t in data.get("tests", [])),
        labs={lab: float((v or {}).get("score", 0.0)) for lab, v in labs.items()},
        lab_statuses={lab: str((v or {}).get("status", "missing")) for lab, v in labs.items()},
        passed=frozenset(str(t.get("name", "")) for t in data.get("tests", [])
                         if t.get("status") == "passed"),
        diagnoses=tuple(_diagnoses(data, labs)), has_feedback=has_feedback,
        fault=read_fault(extra))


# ------------------------------------------------------------------------------ figures

@dataclass(frozen=True)
class Mistake:
    """One diagnosed mistake across the class: who made it, in which tests."""
    lab: str
    name: str
    hint: str
    students: tuple[StudentRecord, ...]
    tests: tuple[str, ...]        # test names, rubric order


def percent(part: int, whole: int) -> int:
    """A share as a whole percentage, halves rounded up (4 of 13 -> 31)."""
    return int(100 * part / whole + 0.5) if whole else 0


def common_mistakes(view: ClassView) -> list[Mistake]:
    """Every diagnosed mistake of the graded students, grouped by lab and mistake name; a
    student counts once however many tests showed it. Most students first, then lab order."""
    order = {t.name: i for lab in view.labs for i, t in enumerate(lab.tests)}
    lab_order = {lab.name: i for i, lab in enumerate(view.labs)}
    groups: dict[tuple[str, str], dict] = {}
    for record in view.students:
        if record.fault is not None:
            continue
        for lab, test, diagnosis in record.diagnoses:
            name = diagnosis_name(diagnosis)
            group = groups.setdefault((lab, name), {
                "hint": diagnosis.split(": ", 1)[1].strip() if ": " in diagnosis else "",
                "students": {}, "tests": set()})
            group["students"][record.student] = record
            group["tests"].add(test)
    mistakes = [Mistake(lab, name, g["hint"], tuple(g["students"].values()),
                        tuple(sorted(g["tests"], key=lambda t: order.get(t, len(order)))))
                for (lab, name), g in groups.items()]
    return sorted(mistakes, key=lambda m: (-len(m.students), lab_order.get(m.lab, 0), m.name))


# ------------------------------------------------------------------------------ HTML

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 1.5em auto;
       max-width: 72em; padding: 0 1em; color: #1d1d1f; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 2px solid #ddd; padding-bottom: 0.2em; }
#notice { background: #fdecea; border-left: 4px solid #c62828; padding: 0.5em 0.8em;
          border-radius: 3px; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #e3e3e3; padding: 0.35em 0.6em; text-align: left;
         vertical-align: top; }
th { background: #f5f5f7; }
td.num { text-align: right; white-space: nowrap; }
.hidden-test { font-size: 0.8em; color: #666; background: #eee; border-radius: 0.6em;
               padding: 0 0.5em; }
.bar { display: inline-block; width: 8em; height: 0.7em; background: #eee; margin-left: 0.5em; }
.bar span { display: block; height: 100%; background: #4c72b0; }
ol.mistakes li { margin: 0.6em 0; padding: 0.5em 0.7em; background: #fff4e5;
                 border-left: 4px solid #f0a020; border-radius: 3px; }
.hint, .where { color: #555; font-size: 0.9em; }
.who a { margin-right: 0.6em; }
#faults li, #submission-problems li { margin: 0.3em 0; }
.fault { background: #eef3fb; border-left: 4px solid #4c72b0; padding: 0.5em 0.8em; }
.status-bad { color: #c62828; }
svg text { font-size: 11px; fill: #333; }
.side { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 0.6em; }
.side pre { font-size: 0.78em; background: #fafafa; border: 1px solid #ddd; padding: 0.4em;
            overflow-x: auto; max-height: 40em; margin: 0; }
.side mark { background: #ffe08a; display: inline-block; width: 100%; }
.side h4 { margin: 0.2em 0; font-size: 0.9em; }
footer { margin-top: 3em; font-size: 0.85em; color: #777; }
"""


def _e(text) -> str:
    """Untrusted text as HTML: printable (no control characters or lone surrogates), escaped."""
    return html.escape(printable(str(text)), quote=True)


def _points(x: float) -> str:
    return f"{round(float(x), 2):g}"


def feedback_href(student: str) -> str:
    """The relative link to a student's feedback.html: the id's raw bytes percent-encoded
    (a name that is not UTF-8 still links to its folder)."""
    return quote(os.fsencode(student), safe="") + "/feedback.html"


def _student_link(record: StudentRecord) -> str:
    if not record.has_feedback:
        return _e(record.student)
    return f'<a href="{_e(feedback_href(record.student))}">{_e(record.student)}</a>'


def _share(part: int, whole: int) -> str:
    """"9 of 13" and "69%" cells, with a bar."""
    pct = percent(part, whole)
    return (f'<td class="num">{part} of {whole}</td><td class="num">{pct}%'
            f'<span class="bar"><span style="width:{pct}%"></span></span></td>')


def _histogram_svg(score: dict, max_total: float) -> str:
    """The totals' histogram as inline SVG: one bar per bin, its count above it."""
    edges, counts = score["histogram"]["bin_edges"], score["histogram"]["counts"]
    width, height, left, bottom, top = 720, 200, 30, 34, 18
    bar_w = (width - left - 10) / max(len(counts), 1)
    tallest = max(counts + [1])
    parts = [f'<svg id="histogram" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" role="img" aria-label="score histogram">',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - 10}" '
             f'y2="{height - bottom}" stroke="#999"/>']
    for i, count in enumerate(counts):
        full = i == len(counts) - 1
        label = f"{_points(max_total)} (full)" if full else \
            f"{_points(edges[i])}-{_points(edges[i + 1])}"
        h = (height - bottom - top) * count / tallest
        x, y = left + i * bar_w, height - bottom - h
        parts.append(f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{bar_w - 2:.1f}" '
                     f'height="{h:.1f}" fill="{"#55a868" if full else "#4c72b0"}">'
                     f"<title>{_e(label)}: {count}</title></rect>")
        if count:
            parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{y - 3:.1f}" '
                         f'text-anchor="middle">{count}</text>')
        if full or i % max(1, len(counts) // 10) == 0:
            parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{height - bottom + 14}" '
                         f'text-anchor="middle">{_e(label)}</text>')
    parts.append(f'<text x="{left}" y="{height - 4}">total score (out of '
                 f"{_points(max_total)}); students per bin</text></svg>")
    return "".join(parts)


def _distribution(view: ClassView, faults: int) -> str:
    score = view.score
    counted = sum(score["histogram"]["counts"])
    out = ['<section id="distribution"><h2>Score distribution</h2>']
    if not counted:
        return out[0] + "<p>No students to show yet.</p></section>"
    out.append(f"<p><strong>{counted} students</strong>: mean {_points(score['mean'])}, "
               f"median {_points(score['median'])}, min {_points(score['min'])}, "
               f"max {_points(score['max'])} (out of {_points(view.max_total)})."
               + (f" The {faults} student(s) the grader failed to grade are left out."
                  if faults else "") + "</p>")
    out.append(_histogram_svg(score, view.max_total))
    return "".join(out) + "</section>"


def _mistakes(view: ClassView, graded: int) -> str:
    mistakes = common_mistakes(view)
    visibility = {(t.lab, t.name): t.visibility for lab in view.labs for t in lab.tests}
    out = ['<section id="mistakes"><h2>Most common diagnosed mistakes</h2>',
           "<p>A diagnosis names a classic mistake that reproduced what a student's code "
           f"returned. Shares are of the {graded} graded students; a student counts once per "
           "mistake however many tests showed it.</p>"]
    if not mistakes:
        return "".join(out) + "<p>No diagnosed mistake in this class.</p></section>"
    out.append('<ol class="mistakes">')
    for m in mistakes:
        tests = ", ".join(
            f"<code>{_e(t)}</code>" + (' <span class="hidden-test">hidden</span>'
                                       if visibility.get((m.lab, t)) == "hidden" else "")
            for t in m.tests)
        who = "".join(_student_link(s) for s in m.students)
        out.append(
            f"<li><strong>{percent(len(m.students), graded)}% of students "
            f"({len(m.students)} of {graded}): {_e(m.name)}</strong> "
            f"<span class=\"where\">({_e(m.lab)})</span>"
            + (f'<div class="hint">{_e(m.hint)}</div>' if m.hint else "")
            + f'<details class="where"><summary>seen in {len(m.tests)} test'
            f'{"s" if len(m.tests) != 1 else ""}</summary>{tests}</details>'
            f'<div class="who">students: {who}</div></li>')
    return "".join(out) + "</ol></section>"


def _labs(view: ClassView, graded: list[StudentRecord]) -> str:
    n = len(graded)
    out = ['<section id="labs"><h2>Pass rates per lab</h2>',
           f"<p>Full marks: the graded students ({n}) who passed every test of the lab.</p>",
           "<table><thead><tr><th>lab</th><th>points</th><th>mean</th><th>full marks</th>"
           "<th></th><th>not submitted or not importable</th></tr></thead><tbody>"]
    for lab in view.labs:
        keys = [f"{lab.name}: {t.name}" for t in lab.tests]
        full = sum(all(k in r.passed for k in keys) for r in graded)
        mean = sum(r.labs.get(lab.name, 0.0) for r in graded) / n if n else 0.0
        problems: dict[str, int] = {}
        for r in graded:
            status = r.lab_statuses.get(lab.name, "missing")
            if status != "graded":
                problems[status] = problems.get(status, 0) + 1
        problem_text = ", ".join(f"{c} {s.replace('_', ' ')}" for s, c in sorted(problems.items()))
        out.append(f"<tr><td>{_e(lab.title)} <code>{_e(lab.name)}</code></td>"
                   f'<td class="num">{_points(lab.max_points)}</td>'
                   f'<td class="num">{_points(mean) if n else "-"}</td>{_share(full, n)}'
                   f"<td>{_e(problem_text) or '-'}</td></tr>")
    return "".join(out) + "</tbody></table></section>"


def _tests(view: ClassView, graded: list[StudentRecord]) -> str:
    n = len(graded)
    out = ['<section id="tests"><h2>Pass rates per test</h2>',
           f"<p>Of the {n} graded students; hidden tests included.</p>",
           "<table><thead><tr><th>lab</th><th>test</th><th>visibility</th><th>points</th>"
           "<th>passed</th><th></th></tr></thead><tbody>"]
    for lab in view.labs:
        for t in lab.tests:
            passed = sum(f"{lab.name}: {t.name}" in r.passed for r in graded)
            out.append(f"<tr><td><code>{_e(lab.name)}</code></td><td><code>{_e(t.name)}</code>"
                       f"</td><td>{_e(t.visibility)}</td>"
                       f'<td class="num">{_points(t.points)}</td>{_share(passed, n)}</tr>')
    return "".join(out) + "</tbody></table></section>"


def _apart(ident: str, title: str, explain: str, none: str,
           records: list[StudentRecord]) -> str:
    out = [f'<section id="{ident}"><h2>{title} ({len(records)})</h2>']
    if not records:
        return out[0] + f"<p>{none}</p></section>"
    out.append(f'<p class="fault">{explain}</p><ul>')
    out.extend(f"<li>{_student_link(r)}: {_e(r.status)}</li>" for r in records)
    return "".join(out) + "</ul></section>"


def _students(view: ClassView) -> str:
    head = "".join(f"<th>{_e(lab.name)}</th>" for lab in view.labs)
    out = ['<section id="students"><h2>Every student</h2>',
           "<p>Each name links to the student's feedback.html.</p>",
           f"<table><thead><tr><th>student</th>{head}<th>total</th><th>status</th></tr>"
           "</thead><tbody>"]
    for r in view.students:
        fault = is_grader_fault(r.fault)
        cells = "".join(f'<td class="num">{"-" if fault else _points(r.labs.get(lab.name, 0.0))}'
                        "</td>" for lab in view.labs)
        total = "not scored" if fault else f"{_points(r.total)} / {_points(r.max_total)}"
        status = "" if r.fault is None else ' class="status-bad"'
        out.append(f"<tr><td>{_student_link(r)}</td>{cells}<td class=\"num\">{total}</td>"
                   f"<td{status}>{_e(r.status)}</td></tr>")
    return "".join(out) + "</tbody></table></section>"


def _marked_source(text: str, spans: list) -> str:
    """The source, escaped, one line each, the lines of ``spans`` ([first, last]) marked."""
    marked = set()
    for span in spans or []:
        first, last = int(span[0]), int(span[1])
        marked.update(range(first, last + 1))
    lines = str(text).splitlines()
    return "\n".join((f"<mark>{_e(line) or ' '}</mark>" if i in marked else _e(line))
                      for i, line in enumerate(lines, start=1))


def _side_by_side(title_a: str, text_a: str, lines_a, title_b: str, text_b: str,
                  lines_b) -> str:
    return ('<div class="side">'
            f"<div><h4>{_e(title_a)}</h4><pre>{_marked_source(text_a, lines_a)}</pre></div>"
            f"<div><h4>{_e(title_b)}</h4><pre>{_marked_source(text_b, lines_b)}</pre></div>"
            "</div>")


def _pct(x) -> str:
    return f"{round(100 * float(x))}%"


def _similarity(report: dict | None) -> str:
    out = ['<section id="similarity"><h2>Similarity: code shared between submissions</h2>']
    if not report:
        return out[0] + "<p>No similarity report for this batch.</p></section>"
    threshold = float(report.get("threshold", 0.5))
    out.append(f'<p class="fault">{_e(report.get("note", ""))} Shown: pairs sharing at least '
               f"{_pct(threshold)} of the smaller submission's fingerprints (winnowing over "
               "normalised tokens: renamed variables, comments, layout and function order do "
               "not hide shared code). All pairs are in similarity.json and "
               '<a href="similarity.csv">similarity.csv</a>.</p>')
    for lab, entry in (report.get("labs") or {}).items():
        entry = entry or {}
        sources = entry.get("sources") or {}
        pairs = [p for p in entry.get("pairs") or [] if p.get("flagged")]
        against = [r for r in entry.get("against") or [] if r.get("flagged")]
        out.append(f'<h3 id="similarity-{_e(lab)}"><code>{_e(lab)}</code>: '
                   f"{len(pairs)} pair(s) and {len(against)} student(s) close to a solution, "
                   f"of {int(entry.get('students', 0))} submissions</h3>")
        if not pairs and not against:
            out.append("<p>Nothing above the threshold.</p>")
            continue
        if pairs:
            out.append('<table class="pairs"><thead><tr><th>student</th><th>student</th>'
                       "<th>shared</th><th>fingerprints shared</th></tr></thead><tbody>")
            for p in pairs:
                out.append(f"<tr><td>{_e(p['a'])}</td><td>{_e(p['b'])}</td>"
                           f'<td class="num">{_pct(p["similarity"])}</td>'
                           f'<td class="num">{int(p["shared"])}</td></tr>')
            out.append("</tbody></table>")
        if against:
            out.append('<table class="against"><thead><tr><th>student</th><th>close to</th>'
                       "<th>shared</th><th>fingerprints shared</th></tr></thead><tbody>")
            for r in against:
                out.append(f"<tr><td>{_e(r['student'])}</td><td>{_e(r['source'])}</td>"
                           f'<td class="num">{_pct(r["similarity"])}</td>'
                           f'<td class="num">{int(r["shared"])}</td></tr>')
            out.append("</tbody></table>")
        opened = ' open'                          # the first one open: the closest pair
        for p in pairs:
            a, b = sources.get(f"student:{p['a']}"), sources.get(f"student:{p['b']}")
            if a is None or b is None:
                continue
            out.append(f'<details class="pair"{opened}><summary>{_e(p["a"])} and {_e(p["b"])}: '
                       f"{_pct(p['similarity'])} shared, side by side</summary>"
                       + _side_by_side(p["a"], a, p.get("lines_a"), p["b"], b, p.get("lines_b"))
                       + "</details>")
            opened = ""
        for r in against:
            a, b = sources.get(f"student:{r['student']}"), sources.get(f"source:{r['source']}")
            if a is None or b is None:
                continue
            out.append(f'<details class="pair"{opened}><summary>{_e(r["student"])} and '
                       f"{_e(r['source'])}: {_pct(r['similarity'])} shared, side by side"
                       "</summary>"
                       + _side_by_side(r["student"], a, r.get("lines_student"), r["source"], b,
                                       r.get("lines_source"))
                       + "</details>")
            opened = ""
    return "".join(out) + "</section>"


def class_page_html(view: ClassView) -> str:
    """The dashboard as one HTML document (no script, no external resource)."""
    graded = [r for r in view.students if r.fault is None]
    faults = [r for r in view.students if is_grader_fault(r.fault)]
    problems = [r for r in view.students if r.fault is Fault.STUDENT]
    labs = ", ".join(lab.name for lab in view.labs) or "no lab"
    overview = (f"{len(view.students)} students: {len(graded)} graded, "
                f"{len(problems)} whose submission could not be graded, "
                f"{len(faults)} not graded (the grader's fault). Labs: {labs}.")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>Class dashboard</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>Class dashboard</h1>",
        '<p id="notice"><strong>Instructor only.</strong> This page names hidden tests and '
        "every student's results: do not publish it or share it with students.</p>",
        f'<p id="overview">{_e(overview)} Files: <a href="grades.csv">grades.csv</a>, '
        '<a href="summary.json">summary.json</a>.</p>',
        _apart("faults", "Not graded: the grader's fault",
               "The grader failed on these submissions: they are not scores and are left out "
               "of every figure here. Run the same batch command again to grade them.",
               "None: the grader graded every submission it was given.", faults),
        _distribution(view, len(faults)),
        _mistakes(view, len(graded)),
        _labs(view, graded),
        _tests(view, graded),
        _apart("submission-problems", "Submissions that could not be graded",
               "Each of these scores 0 (it is in the distribution): the submission itself "
               "could not be graded, for the reason given.",
               "None.", problems),
        _students(view),
        _similarity(view.similarity),
        "<footer>Written by <code>grader batch</code> from the students' results.json, with "
        "grades.csv and summary.json.</footer>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def write_class_page(view: ClassView, path: str | Path) -> Path:
    """Write the dashboard for ``view`` to ``path`` (atomically); returns the path."""
    path = Path(path)
    atomic_write_text(path, class_page_html(view))
    return path
