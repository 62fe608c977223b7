"""Gradescope's ``results.json``: a view of the result model (and its atomic writer).

Each test's output says what failed and the diagnosis; a diagnosis that several failed tests
of a lab share is written out in full once, in the first public test that has it (a hidden
test's output shows only after grades are published), and the others name the mistake and
that test. Each lab's diagnosed mistakes are also kept as data, bounded
(``extra_data.labs.<lab>.mistakes``: name -> hint and the failed tests that showed it), for
the class dashboard (``grader.outputs.class_page``): the text the tests' outputs carry, so
nothing new is shown."""

from __future__ import annotations

import json
from pathlib import Path

from grader.outputs.atomic import atomic_write_text
from grader.outputs.text import (capped, diagnosis_name, handed_in_text, missing_lab_line,
                                 not_handed_in, shared_causes)
from grader.results import LabResult, SubmissionResult, TestResult

# How a rubric visibility maps to Gradescope's: hidden tests appear after grades are published.
GRADESCOPE_VISIBILITY = {"public": "visible", "hidden": "after_published"}
TEST_OUTPUT_CAP = 2048          # characters of one test's output
REPORT_TEXT_CAP = 64 * 1024     # characters of all outputs of one results.json together
# The mistakes kept as data, per lab: a catalogue's worth of names and hints, however many
# tests or whatever text a result holds (results.json stays small).
MISTAKES_PER_LAB = 20
MISTAKE_NAME_CAP = 80
MISTAKE_HINT_CAP = 240



def gradescope_payload(result: SubmissionResult) -> dict:
    """Gradescope's results.json (top-level score, tests[] with per-test fields)."""
    tests = []
    for lab in result.labs:
        if not_handed_in(lab):      # one entry for the lab, its points all in it
            tests.append({"name": f"{lab.name}: not handed in", "name_format": "text",
                          "score": round(lab.score, 4), "max_score": round(lab.max_score, 4),
                          "status": "failed", "visibility": "visible",
                          "output": capped(missing_lab_line(lab), TEST_OUTPUT_CAP),
                          "output_format": "text", "tags": [lab.name]})
            continue
        holders = _hint_holders(lab)
        for t in lab.tests:
            tests.append({
                "name": f"{lab.name}: {t.name}",
                "name_format": "text",
                "score": round(t.score, 4),
                "max_score": round(t.max_score, 4),
                "status": t.status,
                "visibility": GRADESCOPE_VISIBILITY[t.visibility],
                "output": capped(_output_text(t, lab, holders), TEST_OUTPUT_CAP),
                "output_format": "text",
                "tags": [lab.name],
            })
    notes = [f"{lab.file}: {lab.message}" for lab in result.labs
             if lab.message and not not_handed_in(lab)]
    covered = handed_in_text(result)
    if covered:
        notes.append(covered[0].upper() + covered[1:])
    # The whole report stays small whatever the submission did: the tests' outputs first,
    # each cut to what is left of the budget, then the notes.
    budget = REPORT_TEXT_CAP
    for test in tests:
        test["output"] = capped(test["output"], max(0, budget))
        budget -= len(test["output"])
    overview = capped("\n".join(result.notes + notes), max(0, budget))
    return {
        "score": round(result.score, 4),
        "execution_time": round(result.execution_time, 3),
        "output": overview,
        "output_format": "text",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
        "extra_data": {"labs": {lab.name: {"score": round(lab.score, 4),
                                           "max_score": round(lab.max_score, 4),
                                           "status": lab.status,
                                           "fault": lab.fault,
                                           "mistakes": lab_mistakes(lab)}
                                for lab in result.labs},
                       "status": result.status,
                       # whose doing it is that it was not graded (None: it was); what the
                       # gradebook and class dashboard read, never the status's words
                       "fault": result.fault},
    }


def lab_mistakes(lab: LabResult) -> dict[str, dict]:
    """The lab's diagnosed mistakes: name -> {"hint", "tests": failed tests that showed it},
    in the order the tests first show them; at most MISTAKES_PER_LAB, names and hints cut."""
    found: dict[str, dict] = {}
    for t in lab.tests:
        if t.passed or not t.diagnosis:
            continue
        name = capped(diagnosis_name(t.diagnosis), MISTAKE_NAME_CAP)
        if name not in found:
            if len(found) == MISTAKES_PER_LAB:
                continue
            hint = t.diagnosis.split(": ", 1)[1].strip() if ": " in t.diagnosis else ""
            found[name] = {"hint": capped(hint, MISTAKE_HINT_CAP), "tests": []}
        found[name]["tests"].append(t.name)
    return found


def _hint_holders(lab: LabResult) -> dict[str, tuple[TestResult, int]]:
    """For each diagnosis that several failed tests of *lab* share: the test whose output
    carries it in full (the first public one, whose output a student sees before grades
    are published; else the first), and how many tests share it."""
    return {c.diagnosis: (next((t for t in c.tests if t.visibility == "public"), c.tests[0]),
                          len(c.tests)) for c in shared_causes(lab)}


def _output_text(t: TestResult, lab: LabResult, holders: dict) -> str:
    lines = [t.description] if t.description else []
    if t.message:       # a passed test's too: what it reports (lab 8's training figures)
        lines.append(t.message)
    if not t.passed and t.diagnosis:
        holder, count = holders.get(t.diagnosis, (t, 1))
        if holder is t:
            seen = f" (seen in {count} tests of {lab.name})" if count > 1 else ""
            lines.append(f"Diagnosis: {t.diagnosis}{seen}")
        else:      # the hint once per lab: a 29-test lab does not repeat it 29 times
            lines.append(f"Diagnosis: {diagnosis_name(t.diagnosis)} (the hint is in "
                         f"{lab.name}: {holder.name})")
    return "\n".join(lines)


def write_gradescope(result: SubmissionResult, path: Path) -> None:
    atomic_write_text(path, json.dumps(gradescope_payload(result), indent=2) + "\n")
