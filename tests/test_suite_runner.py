"""The long-lived pytest session (grader.engine.suite_runner) and the memoized references.

A batch grades every student of a grading process through one ``SuiteRunner`` (the suites
collected once) and one reference cache; both must give exactly the result that a fresh
``pytest.main`` per submission gives, whatever came before in the same process.
"""

from __future__ import annotations

import shutil
import sys

import pytest
import torch

from helpers import grade, make_submission
from grader import paths
from grader.errors import SubmissionError
from grader.grading import Grader
from grader.engine.memo import memoized
from grader.engine.suite_runner import SuiteRunner
from grader.suites import _inputs

# One of each outcome, in an order where a failing, a crashing and a missing lab come
# before and after full marks: what one student leaves behind must not reach the next.
SEQUENCE = ["bug_softmax_dim", "ok_einsum", "broken_syntax", "missing_lab3",
            "bug_no_scale", "solutions"]


def test_a_shared_runner_grades_like_a_fresh_pytest_run(rubric, zygote, tmp_path):
    folders = [paths.SOLUTIONS if name == "solutions" else
               make_submission(name, tmp_path / name) for name in SEQUENCE]
    with Grader(rubric, zygote=zygote) as grader:      # one pytest session for all
        shared = [grader.grade(f, name=n) for f, n in zip(folders, SEQUENCE, strict=False)]
    for folder, name, got in zip(folders, SEQUENCE, shared, strict=False):
        fresh = grade(folder, rubric=rubric, zygote=zygote, name=name)
        assert got.to_dict_without_timings() == fresh.to_dict_without_timings(), name
    scores = {name: r.score for name, r in zip(SEQUENCE, shared, strict=False)}
    assert scores["solutions"] == scores["ok_einsum"] == rubric.max_points
    assert scores["bug_softmax_dim"] < rubric.max_points
    assert scores["broken_syntax"] < rubric.max_points
    # every rubric test got a result in every submission
    for result in shared:
        assert sum(len(lab.tests) for lab in result.labs) == sum(
            len(spec.tests) for spec in rubric.labs.values())


def test_a_grader_runs_only_the_labs_and_visibility_asked_for(rubric, zygote):
    lab = next(iter(rubric.labs))
    with Grader(rubric, zygote=zygote) as grader:
        result = grader.grade(paths.SOLUTIONS, labs=[lab])
        public = grader.grade(paths.SOLUTIONS, labs=[lab], visibility=("public",))
    assert [l.name for l in result.labs] == [lab]
    assert result.score == rubric.labs[lab].max_points
    assert {t.visibility for t in public.lab(lab).tests} == {"public"}
    assert public.score == sum(t.points for t in rubric.labs[lab].tests.values()
                               if t.visibility == "public")


def test_runner_and_grader_refuse_labs_they_do_not_have(rubric, zygote):
    first, second = list(rubric.labs)[:2]
    with SuiteRunner(rubric=rubric, labs=[first]) as runner, \
            pytest.raises(ValueError, match=second):
        runner.run(None, [second])
    with Grader(rubric, zygote=zygote) as grader, \
            pytest.raises(SubmissionError, match="unknown lab 'lab9_nope'"):
        grader.grade(paths.SOLUTIONS, labs=["lab9_nope"])


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


@pytest.mark.parametrize("shared", [True, False], ids=["shared_runner", "fresh_pytest"])
def test_a_suite_that_fails_to_load_is_a_grader_error_not_a_student_one(
        shared, rubric, zygote, tmp_path, monkeypatch):
    suites = tmp_path / "suites"
    shutil.copytree(paths.SUITES, suites, ignore=shutil.ignore_patterns("__pycache__"))
    broken_lab = list(rubric.labs)[2]
    (suites / "public" / f"test_{broken_lab}.py").write_text("def test_oops(:\n")
    monkeypatch.setattr(paths, "SUITES", suites)
    # pytest's importlib mode names suite modules by their path under the suites folder
    # ("public.test_lab1_attention") and reuses a module already imported under that name:
    # let this copy's files be imported, not the real suites loaded by earlier tests.
    # Afterwards the copy's modules go, and the real ones come back (monkeypatch).
    def suite_modules():
        return [n for n in sys.modules if n.split(".")[0] in ("public", "hidden")]

    for name in suite_modules():
        monkeypatch.delitem(sys.modules, name)
    try:
        if shared:
            with Grader(rubric, zygote=zygote) as grader:
                grader.grade(make_submission("ok_einsum", tmp_path / "before"))
                result = grader.grade(paths.SOLUTIONS)
        else:
            result = grade(paths.SOLUTIONS, rubric=rubric, zygote=zygote)
    finally:
        for name in suite_modules():
            del sys.modules[name]
    assert result.status.startswith("grader error"), result.status
    for lab in result.labs:
        public = [t for t in lab.tests if t.visibility == "public"]
        hidden = [t for t in lab.tests if t.visibility == "hidden"]
        if lab.name == broken_lab:
            assert public and not any(t.passed for t in public)
            assert all("did not run" in t.message for t in public)
            assert all(t.passed for t in hidden)      # its hidden suite still loaded
        else:
            assert all(t.passed for t in lab.tests), lab.name
