"""The class dashboard, DIR/class.html (#19): the builder on a synthetic class (percentages,
grouping, escaping, grader faults apart), a batch that writes it, and a real browser
(headless Chromium) that loads it and shows what the instructor should see."""

from __future__ import annotations

import html
import os
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pytest

from browser import CHROMIUM, SKIP_REASON, dump_dom, screenshot
from grader import paths
from grader.course import Course
from grader.outputs.class_page import (
    ClassView,
    LabInfo,
    StudentRecord,
    TestInfo,
    class_page_html,
    student_record,
    write_class_page,
)
from grader.outputs.gradebook import GRADEBOOK_FILES, NOT_GRADED, score_distribution
from grader.outputs.gradescope import (
    MISTAKE_HINT_CAP,
    MISTAKE_NAME_CAP,
    MISTAKES_PER_LAB,
    gradescope_payload,
)
from grader.results import Fault, LabResult, SubmissionResult, is_grader_fault
from grader.results import TestResult as Outcome     # "Test*": not a pytest class

SOFTMAX = "softmax over the wrong axis: normalise over the keys (dim=-1), not the queries"
NO_SCALE = "no 1/sqrt(d_k) scaling: divide the scores by sqrt(d_k) before the softmax"
LAB1, LAB2 = "lab1_attention", "lab2_multihead"


# ------------------------------------------------------------------- a synthetic class

LABS = [
    LabInfo(LAB1, "Scaled dot-product attention", (
        TestInfo(LAB1, "test_matches", "public", 2.0),
        TestInfo(LAB1, "test_masked", "public", 2.0),
        TestInfo(LAB1, "test_float64", "hidden", 1.0))),
    LabInfo(LAB2, "Multi-head attention", (
        TestInfo(LAB2, "test_heads", "public", 3.0),)),
]
ALL_TESTS = [f"{t.lab}: {t.name}" for lab in LABS for t in lab.tests]
MAX_TOTAL = sum(t.points for lab in LABS for t in lab.tests)


def graded(student: str, failed: dict[str, str] | None = None) -> StudentRecord:
    """A graded student who passed every test but ``failed`` ("lab: test" -> diagnosis or "")."""
    failed = failed or {}
    points = {t.lab + ": " + t.name: t.points for lab in LABS for t in lab.tests}
    labs = {lab.name: sum(t.points for t in lab.tests if f"{lab.name}: {t.name}" not in failed)
            for lab in LABS}
    return StudentRecord(
        student=student, status="ok", total=sum(p for k, p in points.items() if k not in failed),
        max_total=MAX_TOTAL, labs=labs, lab_statuses={lab.name: "graded" for lab in LABS},
        passed=frozenset(k for k in ALL_TESTS if k not in failed),
        diagnoses=tuple((k.split(": ")[0], k.split(": ")[1], d) for k, d in failed.items() if d),
        has_feedback=True)


def not_ok(student: str, status: str, fault: Fault = Fault.STUDENT, *,
           has_feedback: bool = True) -> StudentRecord:
    return StudentRecord(student=student, status=status, total=0.0, max_total=MAX_TOTAL,
                         labs={lab.name: 0.0 for lab in LABS}, lab_statuses={},
                         passed=frozenset(), diagnoses=(), has_feedback=has_feedback,
                         fault=fault)


def view_of(students: list[StudentRecord]) -> ClassView:
    counted = [s.total for s in students if not is_grader_fault(s.fault)]
    return ClassView(labs=LABS, students=students, max_total=MAX_TOTAL,
                     score=score_distribution(counted, MAX_TOTAL))


def thirteen_and_two_apart() -> list[StudentRecord]:
    """13 graded students (4 with the softmax mistake, ana in two tests; 2 unscaled), a
    rejected zip (a real zero) and a grader fault (never a score)."""
    students = [graded(f"s{i:02d}") for i in range(7)]
    students += [graded("ana", {f"{LAB1}: test_matches": SOFTMAX, f"{LAB1}: test_masked": SOFTMAX}),
                 graded("bo", {f"{LAB1}: test_matches": SOFTMAX}),
                 graded("cy", {f"{LAB1}: test_float64": SOFTMAX}),
                 graded("dee", {f"{LAB1}: test_matches": SOFTMAX, f"{LAB2}: test_heads": ""}),
                 graded("eve", {f"{LAB1}: test_matches": NO_SCALE}),
                 graded("fay", {f"{LAB1}: test_masked": NO_SCALE})]
    students += [not_ok("zed", "rejected zip: member '../evil.py' points outside the folder"),
                 not_ok("gil", "grading failed: the grading process died (exit code -9)",
                        Fault.GRADER)]
    return students


class Text(HTMLParser):
    """What a page shows: its text by element id (and in order), and its links."""

    def __init__(self):
        super().__init__()
        self.stack: list[str | None] = []
        self.by_id: dict[str, list[str]] = {}
        self.links: list[tuple[str, str]] = []        # (href, link text)
        self.tags: list[str] = []
        self._href: str | None = None
        self._link_text: list[str] = []

    VOID = {"meta", "br", "img", "hr", "link", "input", "rect", "line"}

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag == "a" and "href" in attrs:
            self._href, self._link_text = attrs["href"], []
        if tag not in self.VOID:
            self.stack.append(attrs.get("id"))

    def handle_endtag(self, tag):
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._link_text)))
            self._href = None
        if tag not in self.VOID and self.stack:
            self.stack.pop()

    def handle_data(self, data):
        if self._href is not None:
            self._link_text.append(data)
        for ident in self.stack:
            if ident:
                self.by_id.setdefault(ident, []).append(data)

    def text(self, ident: str) -> str:
        return " ".join(" ".join(self.by_id.get(ident, [])).split())


def shown(page: str) -> Text:
    parser = Text()
    parser.feed(page)
    return parser


# ------------------------------------------------------------------- results.json

def test_results_json_keeps_each_labs_mistakes_as_data():
    lab = LabResult(LAB1, "t", "lab1_attention.py", tests=[
        Outcome(LAB1, "test_a", "", "public", 1.0, False, "wrong", diagnosis=SOFTMAX),
        Outcome(LAB1, "test_b", "", "hidden", 1.0, False, "wrong", diagnosis=NO_SCALE),
        Outcome(LAB1, "test_c", "", "hidden", 1.0, False, "wrong", diagnosis=SOFTMAX),
        Outcome(LAB1, "test_d", "", "public", 1.0, False, "wrong"),
        Outcome(LAB1, "test_e", "", "public", 1.0, True)])
    labs = gradescope_payload(SubmissionResult("ada", labs=[lab]))["extra_data"]["labs"]
    assert labs[LAB1]["mistakes"] == {
        "softmax over the wrong axis": {"hint": SOFTMAX.split(": ", 1)[1],
                                        "tests": ["test_a", "test_c"]},
        "no 1/sqrt(d_k) scaling": {"hint": NO_SCALE.split(": ", 1)[1], "tests": ["test_b"]}}


def test_the_mistakes_kept_are_bounded_whatever_a_result_holds():
    lab = LabResult(LAB1, "t", "lab1_attention.py", tests=[
        Outcome(LAB1, f"test_{i}", "", "public", 1.0, False, "x",
                diagnosis=f"{i}{'n' * 5000}: {'h' * 50_000}") for i in range(200)])
    mistakes = gradescope_payload(SubmissionResult("ada", labs=[lab]))["extra_data"]["labs"][
        LAB1]["mistakes"]
    assert len(mistakes) == MISTAKES_PER_LAB
    assert all(len(name) <= MISTAKE_NAME_CAP and len(m["hint"]) <= MISTAKE_HINT_CAP
               for name, m in mistakes.items())


def test_a_record_reads_the_mistakes_and_those_of_an_older_results_json():
    lab = LabResult(LAB1, "t", "lab1_attention.py", tests=[
        Outcome(LAB1, "test_a", "", "public", 2.0, False, "wrong", diagnosis=SOFTMAX),
        Outcome(LAB1, "test_b", "", "hidden", 1.0, False, "wrong", diagnosis=SOFTMAX),
        Outcome(LAB1, "test_c", "", "public", 1.0, True)])
    data = gradescope_payload(SubmissionResult("ada", labs=[lab]))
    record = student_record("ada", data, has_feedback=True)
    assert record.status == "ok" and record.total == 1.0 and record.max_total == 4.0
    assert record.labs == {LAB1: 1.0} and record.lab_statuses == {LAB1: "graded"}
    assert record.passed == {f"{LAB1}: test_c"}
    assert record.diagnoses == ((LAB1, "test_a", SOFTMAX), (LAB1, "test_b", SOFTMAX))
    # a results.json written before the mistakes were kept as data: read from the outputs,
    # the full form ("Diagnosis: <name>: <hint> (seen in ...)") and the short one
    del data["extra_data"]["labs"][LAB1]["mistakes"]
    old = student_record("ada", data, has_feedback=True)
    assert [(lab, test, d.split(": ")[0]) for lab, test, d in old.diagnoses] == [
        (LAB1, "test_a", "softmax over the wrong axis"),
        (LAB1, "test_b", "softmax over the wrong axis")]


def test_a_missing_results_json_is_not_graded_and_a_grader_fault():
    record = student_record("ada", None, has_feedback=False, max_total=8.0, missing=NOT_GRADED)
    assert record.status == NOT_GRADED and record.max_total == 8.0
    assert record.fault is Fault.GRADER and is_grader_fault(record.fault)
    assert is_grader_fault(Fault.PLATFORM)
    assert not is_grader_fault(Fault.STUDENT) and not is_grader_fault(None)


def test_class_html_is_a_gradebook_file():
    assert "class.html" in GRADEBOOK_FILES       # a student may not be named so


# ------------------------------------------------------------------- the page

def test_the_most_common_mistakes_with_percentages_and_linked_students():
    page = shown(class_page_html(view_of(thirteen_and_two_apart())))
    mistakes = page.text("mistakes")
    # 4 of the 13 graded students (ana counted once for two tests); most common first
    first = mistakes.index("31% of students (4 of 13): softmax over the wrong axis")
    second = mistakes.index("15% of students (2 of 13): no 1/sqrt(d_k) scaling")
    assert first < second, mistakes
    assert mistakes.count("normalise over the keys (dim=-1)") == 1     # the hint, once
    links = [(href, text) for href, text in page.links if href.endswith("/feedback.html")]
    mistake_links = [text for _href, text in links if text in {"ana", "bo", "cy", "dee"}]
    assert sorted(set(mistake_links)) == ["ana", "bo", "cy", "dee"]
    assert ("ana/feedback.html", "ana") in page.links
    # the tests where it showed, hidden ones too (this page is the instructor's)
    assert "test_float64" in mistakes and "hidden" in mistakes
    # the graded-but-undiagnosed failure is no mistake of the list
    assert "(1 of 13)" not in mistakes


def test_grader_faults_are_listed_apart_and_never_counted_as_scores():
    students = thirteen_and_two_apart()
    page = shown(class_page_html(view_of(students)))
    faults = page.text("faults")
    assert "gil" in faults and "the grading process died" in faults
    assert "zed" not in faults
    problems = page.text("submission-problems")
    assert "zed" in problems and "rejected zip" in problems and "gil" not in problems
    # the distribution: 13 graded + zed's real zero; gil is no score at all
    dist = page.text("distribution")
    assert "14 students" in dist and "min 0" in dist
    histogram = view_of(students).score["histogram"]["counts"]
    assert sum(histogram) == 14
    # pass rates are over the 13 graded students only
    assert "(4 of 13)" in page.text("mistakes")
    assert "of 14" not in page.text("tests") and "of 15" not in page.text("tests")
    # every student is listed; the fault is "not scored", the rejected zip a real 0
    every = page.text("students")
    assert re.search(r"gil - - not scored grading failed", every), every
    assert re.search(r"zed 0 0 0 / 8 rejected zip", every), every


def test_pass_rates_per_lab_and_per_test():
    page = shown(class_page_html(view_of(thirteen_and_two_apart())))
    tests = page.text("tests")
    # test_matches: ana, bo, dee, eve failed -> 9 of 13 = 69%
    assert re.search(r"test_matches public 2 9 of 13 69%", tests), tests
    assert re.search(r"test_masked public 2 11 of 13 85%", tests), tests
    assert re.search(r"test_float64 hidden 1 12 of 13 92%", tests), tests
    assert re.search(r"test_heads public 3 12 of 13 92%", tests), tests
    labs = page.text("labs")
    # full marks on lab 1: the 7 plain students -> 7 of 13 = 54%; lab 2: all but dee
    assert re.search(r"Scaled dot-product attention.*7 of 13 54%", labs), labs
    assert re.search(r"Multi-head attention.*12 of 13 92%", labs), labs


def test_instructor_only_self_contained_and_static():
    page = class_page_html(view_of(thirteen_and_two_apart()))
    assert "instructor only" in shown(page).text("notice").lower()
    assert "<script" not in page.lower()
    # nothing is fetched: no external stylesheet, image, frame or font
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page, re.I)
    assert "@import" not in page and "url(http" not in page


def test_student_names_are_escaped_and_links_relative():
    hostile = "<script>alert(1)</script>"
    students = [graded(hostile, {f"{LAB1}: test_matches": SOFTMAX}), graded('a&b" onload="x'),
                not_ok("<img src=x onerror=alert(2)>", "grading failed: boom <b>", Fault.GRADER)]
    page = class_page_html(view_of(students))
    parsed = shown(page)
    assert not {"script", "img", "b"} & set(parsed.tags), parsed.tags
    assert html.escape(hostile) in page
    feedback = {text: href for href, text in parsed.links if href.endswith("/feedback.html")}
    assert feedback[hostile] == "%3Cscript%3Ealert%281%29%3C%2Fscript%3E/feedback.html"
    assert unquote(feedback['a&b" onload="x']) == 'a&b" onload="x/feedback.html'
    for href, _text in parsed.links:            # relative: a student's folder, or beside
        assert re.fullmatch(r"[A-Za-z0-9%._~-]+(/feedback\.html)?", href), href


def test_a_student_name_that_is_not_utf8_still_links():
    raw = os.fsdecode(b"caf\xe9")                # a Latin-1 file name: a lone surrogate
    page = class_page_html(view_of([graded(raw)]))
    assert "caf%E9/feedback.html" in page
    page.encode("utf-8")                         # the page itself is valid UTF-8


def test_an_empty_class_says_so():
    page = shown(class_page_html(view_of([])))
    assert "no students" in page.text("distribution").lower()
    assert "no diagnosed mistake" in page.text("mistakes").lower()


# ------------------------------------------------------------------- a real browser

needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason=SKIP_REASON)


def dom_after_load(page: Path) -> Text:
    """What the page shows once a browser has loaded it (the DOM after any script)."""
    return shown(dump_dom(page))


@needs_chromium
def test_a_browser_shows_the_dashboard_and_no_student_name_runs(tmp_path):
    hostile = "<script>document.title='pwned'</script>"
    students = thirteen_and_two_apart() + [graded(hostile, {f"{LAB1}: test_matches": SOFTMAX})]
    page = write_class_page(view_of(students), tmp_path / "class.html")
    seen = dom_after_load(page)
    assert "script" not in seen.tags                     # the name stayed text
    assert "Instructor only" in seen.text("notice")
    assert "36% of students (5 of 14): softmax over the wrong axis" in seen.text("mistakes")
    assert hostile in seen.text("mistakes")              # shown as the name it is
    assert "gil" in seen.text("faults") and "gil" not in seen.text("mistakes")
    assert "15 students" in seen.text("distribution")
    shot = screenshot(page, tmp_path / "shot.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------- a batch writes it

@pytest.fixture(scope="module")
def batch_out(tmp_path_factory):
    """A small lab 1 class graded by ``grade_batch``: right, softmax over the queries (twice,
    once in a folder named ``<script>``), unscaled, and a stray file."""
    from helpers import make_submission
    from grader.batch import grade_batch

    root = tmp_path_factory.mktemp("class")
    make_submission("ok_einsum", root / "ada")
    make_submission("bug_softmax_dim", root / "ben")
    make_submission("bug_softmax_dim", root / "<script>")
    make_submission("bug_no_scale", root / "cy")
    (root / "notes.txt").write_text("not a submission\n")
    out = tmp_path_factory.mktemp("out")
    summary = grade_batch(root, out=out, jobs=1, progress=False, course=Course(paths.KIT), labs=[LAB1])
    return out, summary


@pytest.mark.slow
def test_every_batch_writes_the_class_page(batch_out):
    out, summary = batch_out
    assert summary.files["class_html"] == str(out / "class.html")
    page = shown((out / "class.html").read_text(encoding="utf-8"))
    assert "script" not in page.tags
    mistakes = page.text("mistakes")
    assert "50% of students (2 of 4): softmax over the wrong axis" in mistakes, mistakes
    assert "25% of students (1 of 4): no 1/sqrt(d_k) scaling" in mistakes, mistakes
    assert "notes.txt" in page.text("submission-problems")
    assert "5 students: 4 graded, 1 whose submission could not be graded, 0 not graded" \
        in page.text("overview")
    for href, _text in page.links:                     # every link leads to a written file
        if not href.startswith("#"):
            assert (out / unquote(href)).is_file(), href
    assert "%3Cscript%3E/feedback.html" in [href for href, _text in page.links]


@pytest.mark.slow
@needs_chromium
def test_a_browser_opens_the_batchs_class_page(batch_out):
    out, _summary = batch_out
    seen = dom_after_load(out / "class.html")
    assert "script" not in seen.tags
    assert "50% of students (2 of 4): softmax over the wrong axis" in seen.text("mistakes")
    assert "<script>" in seen.text("mistakes")
    assert re.search(r"test_matches_pytorch_3d public 2 1 of 4 25%", seen.text("tests")), \
        seen.text("tests")


# ------------------------------------------------------------------- similarity (#30)

def similarity_view() -> ClassView:
    """The synthetic class with a similarity report: ana's lab 1 copied (renamed) by a
    student with a hostile name, beside an honest classmate."""
    import random
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from copying import rename
    from grader import paths
    from grader.authoring.stubs import strip_solutions
    from grader.batch.integrity import NOTE, THRESHOLD, lab_report
    fixtures = Path(__file__).parent / "fixtures" / "submissions"
    original = (fixtures / "ok_einsum" / f"{LAB1}.py").read_text()
    solution = ((paths.KIT / "solutions") / f"{LAB1}.py").read_text()
    stub = strip_solutions(solution, path=f"{LAB1}.py")
    hostile = "<script>document.title='pwned'</script>"
    entry = lab_report(LAB1, {"ana": original, hostile: rename(original, random.Random(1)),
                              "bo": (fixtures / "ok_manual_softmax" / f"{LAB1}.py").read_text()},
                       {"course solutions": solution}, stub=stub,
                       vocabulary_from=[solution, stub])
    report = {"note": NOTE, "threshold": THRESHOLD, "labs": {LAB1: entry}}
    view = view_of(thirteen_and_two_apart())
    return ClassView(view.labs, view.students, view.max_total, view.score, similarity=report)


def test_the_similarity_section_shows_flagged_pairs_side_by_side():
    page = class_page_html(similarity_view())
    seen = shown(page)
    text = seen.text("similarity")
    assert "changes no grade" in text and "1 pair(s)" in text
    assert "<td>ana</td>" in page and "<td>bo</td>" not in page     # bo wrote their own
    assert page.count('<div class="side">') == 1 and "<mark>" in page
    assert "<script>document" not in page                 # the hostile name is escaped


@needs_chromium
def test_a_browser_shows_the_similarity_report(tmp_path):
    page = write_class_page(similarity_view(), tmp_path / "class.html")
    seen = dom_after_load(page)
    assert "script" not in seen.tags
    assert "changes no grade" in seen.text("similarity")
    shot = screenshot(page, tmp_path / "shot.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
