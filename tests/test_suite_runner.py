"""The long-lived pytest session (grader.engine.suite_runner) and the memoized references.

A batch grades every student of a grading process through one ``SuiteRunner`` (the suites
collected once) and one reference cache; both must give exactly the result that a fresh
``pytest.main`` per submission gives, whatever came before in the same process.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from helpers import make_submission, unbudgeted_labs
from grader import paths
from grader.course import Course

from grader.grading import Grader
from grader.engine.memo import memoized
from grader.engine.suite_runner import SuiteRunner
from grader.suites import _inputs
from grader.errors import GradingIncomplete, RubricError, SubmissionError

# One of each outcome, in an order where a failing, a crashing and a missing lab come
# before and after full marks: what one student leaves behind must not reach the next.
SEQUENCE = ["bug_softmax_dim", "ok_einsum", "broken_syntax", "missing_lab3",
            "bug_no_scale", "solutions"]


def test_a_shared_runner_grades_like_a_fresh_pytest_run(rubric, zygote, graded, tmp_path):
    """On the labs without budgets (helpers.unbudgeted_labs), which hold every lab the
    sequence changes: the session and the reference cache are the same for every lab."""
    labs = unbudgeted_labs(rubric)
    points = sum(rubric.labs[lab].max_points for lab in labs)
    folders = [(paths.KIT / "solutions") if name == "solutions" else
               make_submission(name, tmp_path / name) for name in SEQUENCE]
    with Grader(Course(paths.KIT, rubric), zygote=zygote) as grader:      # one pytest session for all
        shared = [grader.grade(f, labs=labs, name=n)
                  for f, n in zip(folders, SEQUENCE, strict=True)]
    for name, got in zip(SEQUENCE, shared, strict=True):
        fresh, _ = graded(name, labs)                                    # a Grader of its own
        assert got.to_dict_without_timings() == fresh.to_dict_without_timings(), name
    scores = {name: r.score for name, r in zip(SEQUENCE, shared, strict=True)}
    assert scores["solutions"] == scores["ok_einsum"] == points
    assert scores["bug_softmax_dim"] < points
    assert scores["broken_syntax"] < points
    # every rubric test of those labs got a result in every submission
    for result in shared:
        assert [lab.name for lab in result.labs] == labs
        assert sum(len(lab.tests) for lab in result.labs) == sum(
            len(rubric.labs[lab].tests) for lab in labs)


def test_a_grader_runs_only_the_labs_and_visibility_asked_for(rubric, zygote):
    lab = next(iter(rubric.labs))
    with Grader(Course(paths.KIT, rubric), zygote=zygote) as grader:
        result = grader.grade((paths.KIT / "solutions"), labs=[lab])
        public = grader.grade((paths.KIT / "solutions"), labs=[lab], visibility=("public",))
    assert [l.name for l in result.labs] == [lab]
    assert result.score == rubric.labs[lab].max_points
    assert {t.visibility for t in public.lab(lab).tests} == {"public"}
    assert public.score == sum(t.points for t in rubric.labs[lab].tests.values()
                               if t.visibility == "public")


@pytest.mark.parametrize("name, value", [("PYTEST_ADDOPTS", "--durations=5 -rf -x"),
                                         ("PYTEST_PLUGINS", "no_such_plugin_module")])
def test_the_grading_session_ignores_pytest_settings_in_the_environment(rubric, zygote,
                                                                        monkeypatch, name,
                                                                        value):
    """An instructor's PYTEST_ADDOPTS (say --durations, meant for their own test run) or
    PYTEST_PLUGINS reached the grader's own pytest session, which stopped with a usage
    error: every test of every student a grader fault. The session is configured by the
    grader alone."""
    lab = next(iter(rubric.labs))
    monkeypatch.setenv(name, value)
    with Grader(Course(paths.KIT, rubric), zygote=zygote) as grader:
        result = grader.grade((paths.KIT / "solutions"), labs=[lab])
    assert result.score == rubric.labs[lab].max_points
    import os
    assert os.environ[name] == value          # the caller's environment is left as it was


def test_runner_and_grader_refuse_labs_they_do_not_have(rubric, zygote):
    first, second = list(rubric.labs)[:2]
    with SuiteRunner(rubric=rubric, labs=[first]) as runner, \
            pytest.raises(ValueError, match=second):
        runner.run(None, [second])
    with Grader(Course(paths.KIT, rubric), zygote=zygote) as grader, \
            pytest.raises(SubmissionError, match="unknown lab 'lab9_nope'"):
        grader.grade((paths.KIT / "solutions"), labs=["lab9_nope"])


def test_memoized_reference_is_keyed_on_values_and_hands_out_copies():
    calls = []

    @memoized
    def double(x, *, mask=None):
        calls.append(1)
        return x * 2, mask

    a = torch.arange(4.0)
    first, _ = double(a)
    first.zero_()                                     # the caller's copy only
    again, _ = double(torch.arange(4.0))              # equal values, another tensor
    assert torch.equal(again, torch.arange(4.0) * 2) and len(calls) == 1
    double(torch.arange(4.0, dtype=torch.float64))    # another dtype: computed anew
    double(torch.arange(4.0).reshape(2, 2))           # another shape
    double(a, mask=torch.ones(4, dtype=torch.bool))   # another keyword value
    assert len(calls) == 4


def test_memoized_references_equal_the_computation():
    gen = torch.Generator().manual_seed(3)
    sd = _inputs.block_weights(gen, 16, 32)
    x = _inputs.randn(gen, 2, 5, 16)
    cached = _inputs.block_reference_output(sd, 16, 4, 32, x, norm_first=True)
    direct = _inputs.block_reference_output.__wrapped__(sd, 16, 4, 32, x, norm_first=True)
    assert torch.equal(cached, direct)
    assert torch.equal(_inputs.block_reference_output(sd, 16, 4, 32, x, norm_first=True),
                       direct)


def test_a_suite_that_fails_to_load_grades_nobody(rubric, tmp_path, monkeypatch):
    """A broken suite is found before anyone is graded: the Grader refuses the course,
    naming the file and line (a grader error, never a student's lost points)."""
    suites = tmp_path / "suites"
    shutil.copytree(paths.SUITES, suites, ignore=shutil.ignore_patterns("__pycache__"))
    broken_lab = list(rubric.labs)[2]
    broken = suites / "public" / f"test_{broken_lab}.py"
    broken.write_text("def test_oops(:\n")
    monkeypatch.setattr(paths, "SUITES", suites)
    with pytest.raises(RubricError) as exc:
        Grader(Course(paths.KIT, rubric))
    assert any(e.startswith(f"{broken}:1:") for e in exc.value.errors), exc.value.errors


def test_a_test_that_did_not_run_is_a_grader_fault_not_a_score(rubric, zygote, monkeypatch):
    """A graded lab whose test produced no outcome: nothing is scored (GradingIncomplete),
    whatever the other tests said."""
    lost = list(rubric.labs)[1]
    real_run = SuiteRunner.run

    def run_losing_a_lab(self, session, labs):
        outcomes, errors = real_run(self, session, labs)
        return [o for o in outcomes if o.lab != lost], errors

    monkeypatch.setattr(SuiteRunner, "run", run_losing_a_lab)
    with Grader(Course(paths.KIT, rubric), zygote=zygote) as grader, \
            pytest.raises(GradingIncomplete, match="a test did not run") as exc:
        grader.grade((paths.KIT / "solutions"), labs=list(rubric.labs)[:2])
    assert exc.value.exit_code == 3
