"""The class's similarity report (#30): each kind of copying is found, independent correct
solutions are not flagged, the given code of the stubs never counts, notebooks count as .py
files do, and nothing of it reaches a student's files (see also test_batch.py -k similar)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from copying import KINDS, rename
from helpers import FIXTURES, make_submission
from grader import paths, similarity
from grader.course import Course
from grader.authoring.stubs import strip_solutions
from grader.batch.integrity import THRESHOLD, class_report, lab_report, write_report
from grader.batch.students import list_students

LAB1, LAB2 = "lab1_attention", "lab2_multihead"


def solution(lab: str) -> str:
    return ((paths.KIT / "solutions") / f"{lab}.py").read_text(encoding="utf-8")


def stub(lab: str) -> str:
    return strip_solutions(solution(lab), path=str((paths.KIT / "solutions") / f"{lab}.py"))


def fixture_lab(name: str, lab: str) -> str:
    return (FIXTURES / name / f"{lab}.py").read_text(encoding="utf-8")


def report(lab: str, students: dict[str, str], references: dict | None = None) -> dict:
    return lab_report(lab, students, references or {}, stub=stub(lab),
                      vocabulary_from=[solution(lab), stub(lab)])


def score(entry: dict, a: str, b: str) -> float:
    for p in entry["pairs"]:
        if {p["a"], p["b"]} == {a, b}:
            return p["similarity"]
    return 0.0


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("lab,original", [(LAB1, "ok_einsum"), (LAB2, "ok_loops_style")])
def test_each_kind_of_copying_is_flagged_and_honest_classmates_are_not(kind, lab, original):
    source = fixture_lab(original, lab)
    copied = KINDS[kind](source, random.Random(7))
    if copied == source and kind != "verbatim":
        # ok_einsum's lab 1 has no two statements that can trade places; lab 2's case has
        assert (lab, kind) == (LAB1, "moved_statements"), f"{kind} changed nothing"
    students = {"orig": source, "copier": copied, "ref": solution(lab),
                "indep": fixture_lab("ok_manual_softmax" if lab == LAB1 else "ok_einsum", lab)}
    entry = report(lab, students)
    got = score(entry, "orig", "copier")
    assert got >= THRESHOLD, f"a {kind} copy of {original}/{lab} scored {got}"
    flagged = {frozenset((p["a"], p["b"])) for p in entry["pairs"] if p["flagged"]}
    assert flagged == {frozenset(("orig", "copier"))}, entry["pairs"]
    assert entry["pairs"][0]["a"] in ("orig", "copier")        # ranked first


def test_a_copy_of_the_solution_is_flagged_against_the_course_solutions():
    copied = KINDS["everything"](solution(LAB1), random.Random(3))
    entry = report(LAB1, {"copier": copied, "honest": fixture_lab("ok_einsum", LAB1)},
                   {"course solutions": solution(LAB1)})
    close = {r["student"]: r for r in entry["against"]}
    assert close["copier"]["flagged"] and close["copier"]["similarity"] >= THRESHOLD
    assert not close.get("honest", {"flagged": False})["flagged"]
    assert close["copier"]["lines_student"], "the shared lines are located"


def test_the_stubs_given_code_lesson_text_and_todos_never_count():
    given = stub(LAB2)
    vocabulary = similarity.vocabulary_of([solution(LAB2), given])
    assert len(similarity.fingerprint(given, vocabulary=vocabulary)) > 20
    assert len(similarity.fingerprint(given, vocabulary=vocabulary, boilerplate=similarity.
                                      boilerplate_hashes([given], vocabulary=vocabulary))) == 0
    # Two students who handed in the stub (one with the lesson text and TODOs reworded)
    # share nothing; a student's own code next to the given code counts only itself.
    reworded = KINDS["recommented"](given, random.Random(1))
    entry = report(LAB2, {"a": given, "b": reworded, "c": given + "\n\nvalue = 1\n"})
    assert entry["pairs"] == []
    # The given code alone is most of a lab file, yet a copy of it with the solution written
    # independently is not flagged, while the same code written in the given file is.
    honest = {"ref": solution(LAB2), "einsum": fixture_lab("ok_einsum", LAB2)}
    without = report(LAB2, honest)
    assert not any(p["flagged"] for p in without["pairs"])
    raw = lab_report(LAB2, honest, {}, stub="", vocabulary_from=[solution(LAB2)])
    assert score(raw, "ref", "einsum") > score(without, "ref", "einsum"), \
        "with no boilerplate removed, the given code would count as shared"


def _notebook(path: Path, code: str) -> None:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": "# Lab 1\nThe lesson text."},
             {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
              "source": code}]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}), encoding="utf-8")


def test_a_notebook_is_compared_as_its_code(tmp_path, rubric):
    root = tmp_path / "class"
    make_submission("ok_einsum", root / "pyfile")
    nb = make_submission("ok_einsum", root / "notebook")
    (nb / f"{LAB1}.py").unlink()
    _notebook(nb / f"{LAB1}.ipynb", rename(fixture_lab("ok_einsum", LAB1), random.Random(2)))
    make_submission("ok_manual_softmax", root / "honest")
    got = class_report(list_students(root), Course(paths.KIT, rubric), [LAB1])["labs"][LAB1]
    assert got["students"] == 3
    assert score(got, "notebook", "pyfile") >= THRESHOLD
    assert score(got, "honest", "pyfile") < THRESHOLD
    assert score(got, "honest", "notebook") < THRESHOLD


def test_similar_to_a_folder_of_past_solutions_and_the_report_files(tmp_path, rubric):
    root, past = tmp_path / "class", tmp_path / "last-term"
    make_submission("ok_loops_style", root / "ana")
    make_submission("ok_manual_softmax", root / "bo")
    make_submission("ok_loops_style", past / "old-student")
    (past / "old-student" / f"{LAB1}.py").write_text(
        KINDS["everything"](fixture_lab("ok_loops_style", LAB1), random.Random(5)))
    got = class_report(list_students(root), Course(paths.KIT, rubric), [LAB1], similar_to=[past])
    close = {(r["student"], r["source"]): r for r in got["labs"][LAB1]["against"]}
    assert close[("ana", "last-term/old-student")]["flagged"]
    assert not any(r["flagged"] for (s, _), r in close.items() if s == "bo")
    assert "changes no grade" in got["note"]
    (tmp_path / "out").mkdir()
    files = write_report(got, tmp_path / "out")
    rows = files["similarity_csv"].read_text().splitlines()
    assert rows[0].startswith('"lab","kind","student"') and any('"ana"' in r for r in rows)
    assert "changes no grade" in rows[-1]
    assert json.loads(files["similarity_json"].read_text())["labs"][LAB1]["against"]


def test_the_report_grows_with_shared_fingerprints_not_with_all_pairs():
    # 300 students who share nothing: no pair is ever made, whatever the class size.
    rng = random.Random(0)
    prints = {}
    for i in range(300):
        prints[i] = similarity.Fingerprints({rng.getrandbits(60): [(1, 1)] for _ in range(50)})
    assert similarity.similar_pairs(prints) == []
    # A fingerprint every student holds is common code: it makes no pair either.
    for fp in prints.values():
        fp.spans[42] = [(1, 1)]
    assert similarity.similar_pairs(prints) == []


def test_a_copy_with_a_syntax_error_left_in_is_still_a_copy():
    source = fixture_lab("ok_einsum", LAB1)
    lines = rename(source, random.Random(4)).splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("if "))
    lines[at] = lines[at].replace(":", "", 1)                  # the missing colon of a typo
    broken = "".join(lines)
    with pytest.raises(SyntaxError):
        compile(broken, "lab1_attention.py", "exec")
    entry = report(LAB1, {"orig": source, "broken": broken, "ref": solution(LAB1)})
    assert score(entry, "orig", "broken") >= THRESHOLD
    assert score(entry, "ref", "broken") < THRESHOLD
