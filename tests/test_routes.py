"""One submission, two routes, one grade (#31): a batch and a single ``grader grade`` of the
same files agree on every test's outcome, beside two CPU hogs.

The benchmark once printed "pytest baseline and batch disagree: s00025: pytest 200, batch
198": the grade must not depend on the route or on the machine's load. The labs graded here
are those whose tests measure time or resources against the student's worker (labs 5 and
6: work and memory, each measured beside the course reference) and lab 7: the figures a
loaded machine could move; the other labs' tests compare values only.
"""

from __future__ import annotations

import contextlib
import json
import subprocess


from helpers import grade, make_submission
from grader import paths
from grader.batch import grade_batch
from grader.course import Course

LABS = ["lab5_decoder", "lab6_efficient_attention", "lab7_relative_positions"]


@contextlib.contextmanager
def cpu_hogs(count: int = 2):
    """``count`` busy processes of our own (``yes``), ended by their pids afterwards."""
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(count)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def outcomes_of_batch(results_json: dict) -> dict[str, float]:
    """test name ("lab: test") -> score, from a batch's results.json."""
    return {t["name"]: t["score"] for t in results_json["tests"]}


def outcomes_of_grade(result) -> dict[str, float]:
    return {f"{lab.name}: {t.name}": t.score for lab in result.labs for t in lab.tests}


def test_batch_and_grade_give_every_test_the_same_outcome_beside_two_cpu_hogs(
        tmp_path, rubric, zygote):
    root = tmp_path / "class"
    submission = make_submission("ok_einsum", root / "s1")
    with cpu_hogs(2):
        batch = grade_batch(root, out=tmp_path / "out", jobs=1, progress=False, labs=LABS,
                            course=Course(paths.KIT, rubric))
        single = grade(submission, rubric=rubric, zygote=zygote, labs=LABS)
    assert batch.graded == 1, batch
    by_batch = outcomes_of_batch(json.loads((tmp_path / "out" / "s1" / "results.json")
                                            .read_text()))
    by_grade = outcomes_of_grade(single)
    assert sorted(by_batch) == sorted(by_grade)
    differ = {name: (by_batch[name], by_grade[name]) for name in by_grade
              if by_batch[name] != by_grade[name]}
    assert not differ, f"batch and grade disagree (batch, grade): {differ}"
    # Both routes give the correct submission full marks: agreement on a lost point would
    # still be a point lost to the load.
    assert batch.not_ok == 0 and batch.max_total == single.max_score
    assert single.score == single.max_score, [n for n, s in by_grade.items() if not s]
