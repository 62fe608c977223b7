"""The class's similarity report (``OUT/similarity.json`` and ``OUT/similarity.csv``): per lab,
the pairs of students ranked by how much code they share, and each student against the
course's solutions and any folder of past or public solutions (``--similar-to DIR``).

The method is ``grader.similarity`` (winnowed fingerprints of normalised tokens); this module
gathers what it compares: each student's lab sources as grading reads them
(``grader.intake.sanitize``: a ``.py`` or the code of a ``.ipynb``; a zip unpacked by
``grader.intake.zips``), the boilerplate (the stubs generated from ``solutions/``: their given
code, lesson text, TODOs and docstrings never count) and the vocabulary (the attribute names
the course's own code uses). Nothing here runs student code, and the report changes no grade:
it is evidence for the instructor to look at, and only class.html (instructor-only) shows it.
"""

from __future__ import annotations

import json
import multiprocessing
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from grader import similarity
from grader.authoring.stubs import strip_solutions
from grader.batch.students import Entry, list_students
from grader.errors import GraderError
from grader.intake import sanitize
from grader.intake.zips import unpack_zip
from grader.outputs import spreadsheet
from grader.outputs.atomic import atomic_open, atomic_write_text
from grader.course import Course

THRESHOLD = 0.5        # flagged from here (benchmarks/bench_similarity.py: honest <= 0.42)
SHOWN = 10             # flagged pairs per lab whose sources class.html shows side by side
PARALLEL_FROM = 400    # lab files in the class from which the labs go to processes
KEPT = 200             # pairs per lab kept in the report (the most similar)
NOTE = ("Evidence for a person to look at, not a finding: this report changes no grade. "
        "Shared code is counted after the given code of the stubs is removed.")
SOLUTIONS = "course solutions"


def _lab_sources(path: Path, kind: str, course: Course, labs: list[str]) -> dict[str, str]:
    """lab -> source text of one submission (folder, zip or single file); labs it lacks or
    that cannot be read are left out."""
    rubric = course.rubric

    def read(folder: Path) -> dict[str, str]:
        got = sanitize(folder, rubric, labs, solutions=course.solutions)
        by_file = {rubric.labs[lab].file: lab for lab in labs}
        return {by_file[name]: data.decode("utf-8", "replace")
                for name, data in got.files.items() if name in by_file}
    try:
        if kind == "zip":
            with tempfile.TemporaryDirectory(prefix="similarity-") as tmp:
                unpack_zip(path, Path(tmp) / "x")
                return read(Path(tmp) / "x")
        return read(path)
    except (GraderError, OSError, ValueError):
        return {}


def _reference_sources(dirs: list[Path], course: Course, labs: list[str]) -> dict[str, dict]:
    """label -> lab -> source: the course's solutions, and each ``--similar-to`` folder (its
    own lab files, and each entry in it: one past submission each)."""
    found = {SOLUTIONS: _lab_sources(course.solutions, "folder", course, labs)}
    for folder in dirs:
        folder = Path(folder)
        if not folder.is_dir():
            raise GraderError(f"--similar-to {folder}: not a folder of solutions")
        own = _lab_sources(folder, "folder", course, labs)
        if own:
            found[f"{folder.name}/"] = own
        for entry in list_students(folder):
            if entry.kind in ("folder", "zip") and not entry.problem:
                got = _lab_sources(entry.path, entry.kind, course, labs)
                if got:
                    found[f"{folder.name}/{entry.student}"] = got
    return found


def lab_report(lab: str, students: dict[str, str], references: dict[str, str], *,
               stub: str, vocabulary_from: list[str], threshold: float = THRESHOLD) -> dict:
    """One lab's report from ``students`` (id -> source) and ``references`` (label -> source)."""
    vocabulary = similarity.vocabulary_of(vocabulary_from)
    boilerplate = similarity.boilerplate_hashes([stub], vocabulary=vocabulary)
    keyed = {("student", s): text for s, text in students.items()}
    keyed.update({("source", r): text for r, text in references.items()})
    prints = {key: similarity.fingerprint(text, vocabulary=vocabulary, boilerplate=boilerplate)
              for key, text in keyed.items()}
    pairs, against = [], []
    for p in similarity.similar_pairs(prints):
        (kind_a, a), (kind_b, b) = p.a, p.b
        if kind_a == kind_b == "source":
            continue
        row = {"similarity": round(p.similarity, 4), "shared": p.shared,
               "flagged": p.similarity >= threshold}
        if kind_a == kind_b == "student":
            if len(pairs) < KEPT:
                pairs.append({"a": a, "b": b, **row, "fingerprints_a": p.size_a,
                              "fingerprints_b": p.size_b,
                              "lines_a": similarity.shared_lines(prints[p.a], prints[p.b]),
                              "lines_b": similarity.shared_lines(prints[p.b], prints[p.a])})
        else:
            student, source = (a, b) if kind_a == "student" else (b, a)
            skey, rkey = ("student", student), ("source", source)
            against.append({"student": student, "source": source, **row,
                            "fingerprints_student": len(prints[skey]),
                            "lines_student": similarity.shared_lines(prints[skey], prints[rkey]),
                            "lines_source": similarity.shared_lines(prints[rkey], prints[skey])})
    shown = {x for p in pairs[:SHOWN] if p["flagged"] for x in (("student", p["a"]),
                                                                ("student", p["b"]))}
    shown |= {x for r in against if r["flagged"]
              for x in (("student", r["student"]), ("source", r["source"]))}
    return {"students": len(students), "pairs": pairs, "against": against,
            "sources": {f"{kind}:{name}": keyed[(kind, name)] for kind, name in sorted(shown)}}


def _lab_report_of(work: tuple) -> dict:
    lab, students, references, stub, vocabulary_from, threshold = work
    return lab_report(lab, students, references, stub=stub, vocabulary_from=vocabulary_from,
                      threshold=threshold)


def lab_reports(work: list[tuple], *, jobs: int = 1) -> list[dict]:
    """``lab_report`` of each (lab, students, references, stub, vocabulary_from, threshold),
    the labs side by side in up to ``jobs`` fresh processes ('spawn': nothing of the batch's
    state is inherited) once the class is large enough to repay their start."""
    large = sum(len(w[1]) for w in work) >= PARALLEL_FROM
    if jobs <= 1 or len(work) <= 1 or not large:
        return [_lab_report_of(w) for w in work]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(work)), mp_context=context) as pool:
        return list(pool.map(_lab_report_of, work))


def class_report(entries: list[Entry], course: Course, labs: list[str], *,
                 similar_to: list[Path] | None = None, threshold: float = THRESHOLD,
                 jobs: int = 1) -> dict:
    """The whole class's report: one ``lab_report`` per lab (``jobs``: processes)."""
    rubric = course.rubric
    per_student = {e.student: _lab_sources(e.path, e.kind, course, labs)
                   for e in entries if not e.problem and e.kind in ("folder", "zip")}
    references = _reference_sources(list(similar_to or []), course, labs)
    report = {"note": NOTE, "threshold": threshold,
              "method": {"name": "winnowing over normalised tokens (Schleimer et al. 2003)",
                         "k": similarity.K, "window": similarity.W, "common": similarity.COMMON,
                         "score": "shared fingerprints / the smaller set"},
              "labs": {}}
    work = []
    for lab in labs:
        solution_path = course.solutions / rubric.labs[lab].file
        solution = solution_path.read_text(encoding="utf-8") if solution_path.is_file() else ""
        stub = strip_solutions(solution, path=str(solution_path)) if solution else ""
        work.append((lab, {s: got[lab] for s, got in per_student.items() if lab in got},
                     {r: got[lab] for r, got in references.items() if lab in got},
                     stub, [solution, stub], threshold))
    for lab, entry in zip(labs, lab_reports(work, jobs=jobs), strict=True):
        report["labs"][lab] = entry
    return report


def write_report(report: dict, out: Path) -> dict[str, Path]:
    """similarity.json (everything, with the shown sources) and similarity.csv (one row per
    pair and per student against a source), atomically."""
    out = Path(out)
    atomic_write_text(out / "similarity.json", json.dumps(report, indent=1) + "\n")
    with atomic_open(out / "similarity.csv", "w", encoding="utf-8", errors="backslashreplace",
                     newline="") as fh:
        writer = spreadsheet.writer(fh)
        writer.writerow(["lab", "kind", "student", "other", "similarity", "shared",
                         "flagged", "note"])
        for lab, entry in report["labs"].items():
            for p in entry["pairs"]:
                writer.writerow([lab, "pair", p["a"], p["b"], p["similarity"], p["shared"],
                                 "yes" if p["flagged"] else "no", ""])
            for r in entry["against"]:
                writer.writerow([lab, "source", r["student"], r["source"], r["similarity"],
                                 r["shared"], "yes" if r["flagged"] else "no", ""])
        writer.writerow(["", "note", "", "", 0, 0, "", report["note"]])
    return {"similarity_json": out / "similarity.json", "similarity_csv": out / "similarity.csv"}

