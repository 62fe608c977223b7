"""Calls into another lab (#25): the whole lab reports of the fixtures that try them.

A lab imports only the contract functions of earlier labs; a call is answered by the
course's reference in a reference worker (bounded sizes, capped reply), refused during a
measured call; an honest import loses no points.
"""

from __future__ import annotations

import shutil

import pytest

from helpers import grade, make_submission
from grader import paths
from grader.course import Course
from grader.engine.student import MAX_CALLBACK_SCALAR, Session
from grader.grading import Grader
from grader.sandbox import make_scratch, protocol

ATTACKS = paths.KIT / "tests" / "fixtures" / "attacks"


def _with_attack(name: str, dest):
    """The reference solutions overlaid with attack fixture ``name``'s files."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted((paths.KIT / "solutions").glob("lab*.py")):
        shutil.copyfile(f, dest / f.name)
    for f in sorted((ATTACKS / name).glob("*.py")):
        shutil.copyfile(f, dest / f.name)
    return dest


def test_a_later_lab_cannot_be_imported_and_the_message_says_what_can(rubric, zygote,
                                                                     tmp_path):
    """Lab 3 returning lab 8's given sinusoidal_table: no points, and the import error
    names the later lab and the names lab 3 may import."""
    submission = _with_attack("atk_later_lab_given_code", tmp_path / "s")
    lab3 = grade(submission, rubric=rubric, zygote=zygote,
                 labs=["lab3_positional"]).lab("lab3_positional")
    assert lab3.score == 0, [(t.name, t.passed) for t in lab3.tests]
    # The import is inside the function: each test that calls it fails, saying why.
    told = [t.message for t in lab3.tests
            if "lab3_positional may not import lab8_train_transformer" in t.message]
    assert told, [t.message for t in lab3.tests]
    assert all("lab1_attention.scaled_dot_product_attention" in m for m in told), told[0]


def test_numbers_that_size_work_are_bounded_in_calls_into_other_labs(rubric, zygote):
    """A call sized by an integer past the bound is refused before any worker runs it;
    one inside the bound is answered by the reference worker."""
    with Grader(Course(paths.KIT, rubric), zygote=zygote) as grader:
        importable = grader._importable
    reference = make_scratch({f.name: f.read_bytes() for f in (paths.KIT / "solutions").glob("lab*.py")})
    session = Session(zygote=zygote, submission_dir=reference.name, forbidden={},
                      importable=importable, reference_dir=reference.name)
    try:
        session.start_test(20, test="t", lab="lab2_multihead")
        with pytest.raises(ValueError, match="bounded by"):
            session._callback("lab2_multihead", protocol.callback_request(
                "lab1_attention", "causal_mask", [MAX_CALLBACK_SCALAR * 32], {}, 0))
        # 16384 x 16384 booleans is 256 MiB: past the reply cap, the worker's reply is refused.
        with pytest.raises(RuntimeError, match="course's lab1_attention"):
            session._callback("lab2_multihead", protocol.callback_request(
                "lab1_attention", "causal_mask", [16384, 16384], {}, 0))
        small = session._callback("lab2_multihead", protocol.callback_request(
            "lab1_attention", "causal_mask", [4], {}, 0))
        assert tuple(small.shape) == (4, 4)
        assert session.fault is None, session.fault
    finally:
        session.close()
        reference.cleanup()


def test_work_handed_to_lab1_fails_the_measured_tests_only(rubric, zygote, tmp_path):
    """Lab 6 handing its attention to lab 1: right values (unmeasured calls are answered),
    but a measured call refuses calls into other labs, and says so."""
    submission = make_submission("bug_lab6_memory_through_lab1", tmp_path / "s")
    lab6 = grade(submission, rubric=rubric, zygote=zygote,
                 labs=["lab6_efficient_attention"]).lab("lab6_efficient_attention")
    failed = {t.name: t.message for t in lab6.tests if not t.passed}
    assert "test_chunked_matches_full_attention" not in failed, failed
    assert "test_chunked_attention_memory_stays_linear" in failed, sorted(failed)
    assert all("memory" in name or "work" in name or "grows" in name for name in failed), \
        sorted(failed)
    public = failed["test_chunked_attention_memory_stays_linear"]
    assert "not answered during a measured call" in public, public


@pytest.mark.slow
def test_lab8_using_its_own_lab1_keeps_full_marks(rubric, zygote, tmp_path):
    """Lab 8's Attention through lab 1's scaled_dot_product_attention: every call of its
    training answered, the reference's CPU time charged, within the budget: full marks."""
    submission = make_submission("ok_lab8_own_lab1", tmp_path / "s")
    lab8 = grade(submission, rubric=rubric, zygote=zygote,
                 labs=["lab8_train_transformer"]).lab("lab8_train_transformer")
    assert lab8.score == lab8.max_score, [(t.name, t.message) for t in lab8.tests
                                          if not t.passed]
