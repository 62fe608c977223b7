"""Feedback that teaches: named mistakes (grader.diagnose, grader.mistakes) and the HTML report.

Every catalogued mistake has a one-bug fixture submission (tests/fixtures/submissions/bug_*)
and must be named on at least one failing test of every lab the fixture breaks, and no other
mistake may be named there. Correct submissions (solutions/ and every ok_* fixture) get no
diagnosis, not even when the diagnoser is forced to run on their (passing) tests. The HTML
report must render: one row per test, embedded PNGs that decode, nothing of hidden tests'
values or pictures. Each fixture is graded once for the whole test process (the session's
``graded``, shared with test_grading and test_call_plan: tests/helpers.py SharedGradings).
"""

from __future__ import annotations

import base64
import html
import json
import re
import struct
import time
import zlib
from html.parser import HTMLParser

import pytest
import torch

from helpers import FIXTURES, expectation, fixture_names, labs_changed
from grader import paths
from grader.engine.compare import Mismatch, assert_close
from grader.diagnose import diagnose, examine
from grader.outputs.html import render_feedback_html, write_feedback_html
from grader.mistakes import LABS, Mistake, all_mistakes, catalogue
from grader import results
from grader.rubric import Tolerance
from grader.engine.student import RecordedCall
from grader.outputs.gradescope import gradescope_payload

# fixture -> the id of the catalogued mistake it holds
EXPECTED = {
    "bug_no_scale": "no_scale",
    "bug_scale_d_model": "scale_d_model",
    "bug_softmax_dim": "softmax_dim",
    "bug_mask_inverted": "mask_inverted",
    "bug_mask_after_softmax": "mask_after_softmax",
    "bug_nan_blocked_rows": "nan_blocked_rows",
    "bug_dropout_in_eval": "dropout_in_eval",
    "bug_dropout_no_rescale": "dropout_no_rescale",
    "bug_split_no_transpose": "split_no_transpose",
    "bug_merge_order": "merge_order",
    "bug_causal_off_by_one": "causal_off_by_one",
    "bug_sin_cos_swapped": "sin_cos_swapped",
    "bug_exponent_i": "exponent_i",
    "bug_odd_d_model": "odd_d_model",
    "bug_max_len_unchecked": "max_len_unchecked",
    "bug_norm_first_ignored": "norm_first_ignored",
    "bug_missing_residual": "missing_residual",
    "bug_mask_not_inverted": "mask_not_inverted",
    "bug_activation_ignored": "activation_ignored",
    "bug_float32_cast": "float32_cast",
    "bug_detached_residual": "detached_gradients",
    # written as in well-known public implementations (each a way they differ from the contract)
    "bug_mask_fill_finite": "mask_fill_finite",
    "bug_mha_mask_fill_finite": "mask_fill_finite",
    "bug_weights_before_dropout": "weights_before_dropout",
    "bug_dropout_missing": "dropout_missing",
    "bug_gelu_tanh": "gelu_tanh",
    "bug_float32_constant": "float32_precision",
    "bug_causal_top_left": "causal_top_left",
    "bug_mask_polarity_multiplied": "mask_inverted",
    "bug_cache_positions_restart": "cache_positions_restart",
    "bug_cache_positions_off_by_one": "cache_positions_off_by_one",
    "bug_chunk_causal_top_left": "chunk_causal_top_left",
    "bug_chunk_mask_square": "chunk_mask_square",
    "bug_cache_only_new": "cache_only_new",
    "bug_cache_not_appended": "cache_not_appended",
    "bug_cache_wrong_axis": "cache_wrong_axis",
    "bug_cache_prepended": "cache_prepended",
    "bug_cache_before_projection": "cache_before_projection",
    "bug_step_max_len_unchecked": "step_max_len_unchecked",
    # lab 6: efficient attention
    "bug_online_softmax_no_rescale": "online_softmax_no_rescale",
    "bug_chunked_causal_top_left": "causal_top_left",
    "bug_window_off_by_one": "window_off_by_one",
    "bug_feature_map_not_positive": "feature_map_not_positive",
    "bug_prefix_sum_exclusive": "prefix_sum_exclusive",
    "bug_linear_attention_quadratic": "quadratic_memory",
    "bug_chunked_output_like_q": "output_width_of_queries",
    "bug_window_output_like_q": "output_width_of_queries",
    "bug_window_below_one_unchecked": "window_below_one_not_refused",
    # lab 7: relative positions (RoPE, ALiBi)
    "bug_rope_angles_float32": "rope_angles_float32",
    "bug_rope_rotate_half": "rope_rotate_half",
    "bug_rope_frequencies": "rope_frequencies_exponent",
    "bug_rope_rotation_reversed": "rope_rotation_reversed",
    "bug_rope_scores_unscaled": "rope_scores_unscaled",
    "bug_alibi_slopes_reversed": "alibi_slopes_reversed",
    "bug_alibi_slopes_any_n": "alibi_slopes_power_of_two_formula",
    "bug_alibi_sign": "alibi_bias_sign",
    "bug_alibi_top_left": "alibi_offset_top_left",
    # lab 7 in another style (#42): conventions of public code, float32 on other routes
    "bug_alibi_bias_per_key": "alibi_bias_per_key",
    "bug_alibi_slopes_sorted": "alibi_slopes_sorted",
    "bug_alibi_slopes_start_at_one": "alibi_slopes_start_at_one",
    "bug_rope_theta_float32": "rope_angles_float32",
    "bug_rope_angles_float32_cast": "rope_angles_float32",
    # lab 8: the encoder-decoder, trained
    "bug_cross_attention_keys_from_decoder": "cross_attention_keys_from_decoder",
    "bug_decoder_not_causal": "decoder_not_causal",
    "bug_pad_keys_not_masked": "pad_keys_not_masked",
    "bug_teacher_forcing_off_by_one": "teacher_forcing_off_by_one",
}
# bug_ fixtures whose mistake is no catalogued value mistake: a forbidden API (the lab's
# status), the full score matrix built (right values; the resource tests take its points)
# bug_ fixtures with no catalogued diagnosis: resource failures (memory, work against the
# reference: the resource test's own message teaches), lab 8's outcome tests, and a lab 6
# that hands its attention to lab 1 (the refusal during a measured call says why, #25).
NOT_DIAGNOSED = {"bug_forbidden_branch", "bug_materialised_scores", "bug_dense_below_threshold",
                 "bug_generate_recomputes_prefix", "bug_online_softmax_missing",
                 "bug_running_max_zero_init", "bug_sliding_window_full_matrix",
                 "bug_lab8_decode_tokens_after_eos", "bug_lab8_loss_counts_pad",
                 "bug_lab6_memory_through_lab1"}
CORRECT = ["solutions"] + fixture_names("ok_")


def only_loss_curves(artifacts) -> bool:
    """A passed test's pictures: none, but lab 8's training loss curve."""
    return all(a.get("kind") == "resource" and "training loss" in a.get("title", "")
               for a in artifacts)


def name_of(diagnosis: str) -> str:
    return diagnosis.split(": ", 1)[0]


def failing(result):
    return [(lab.name, t) for lab in result.labs for t in lab.tests if not t.passed]


# ------------------------------------------------------------------------------------------
# the catalogue
# ------------------------------------------------------------------------------------------


def test_every_catalogued_mistake_has_a_fixture():
    ids = {m.id for lab in LABS for m in catalogue(lab)}
    assert ids == set(EXPECTED.values()), "catalogue and EXPECTED disagree"
    assert set(EXPECTED) <= set(fixture_names("bug_")), "a fixture in EXPECTED is missing"
    assert set(fixture_names("bug_")) - set(EXPECTED) == NOT_DIAGNOSED, \
        "a bug_ fixture that no test expects a diagnosis of"
    for m in all_mistakes().values():
        assert isinstance(m, Mistake)
        assert ": " not in m.name and m.hint and len(m.diagnosis) < 400, m.id


# ------------------------------------------------------------------------------------------
# every mistake is named, and only it
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_fixture_mistake_is_named(fixture, graded):
    breaks = tuple(expectation(fixture).get("breaks") or ())
    assert breaks, fixture
    result, _ = graded(fixture, breaks)
    want = all_mistakes()[EXPECTED[fixture]].name
    for lab in breaks:
        fails = [t for t in result.lab(lab).tests if not t.passed]
        assert fails, f"{fixture}: {lab} should fail some test"
        # Every failing test names the cause, not only one of them.
        unnamed = [(t.name, t.diagnosis) for t in fails
                   if not t.diagnosis or name_of(t.diagnosis) != want]
        assert not unnamed, f"{fixture}: failing tests of {lab} that do not name {want!r}: {unnamed}"
    wrong = {(lab, t.name): t.diagnosis for lab, t in failing(result)
             if t.diagnosis and name_of(t.diagnosis) != want}
    assert not wrong, f"{fixture}: other mistakes named: {wrong}"
    for lab in result.labs:
        for t in lab.tests:
            if t.passed:
                assert not t.diagnosis and only_loss_curves(t.artifacts), (fixture, t.name)
            if t.visibility == "hidden":
                assert not t.artifacts, (fixture, t.name)


def test_checked_diagnosis_replaces_the_tests_guess_and_hidden_raises_say_what(graded):
    """A test's own "Likely cause" is a guess: where the catalogue names the mistake (checked
    against the submission), the guess that the figures contradict is left out (a cache
    prepended is no causal-mask mistake). A hidden test waiting on a ValueError says which
    exception came instead, not only "a check failed"; a call that ran out of memory is
    named, not left as "your code raised RuntimeError"."""
    result, _ = graded("bug_cache_prepended", ("lab5_decoder",))
    split = next(t for t in result.lab("lab5_decoder").tests
                 if t.name == "test_any_chunk_split_matches_parallel_forward")
    assert not split.passed and name_of(split.diagnosis) == "new keys put before the cached ones"
    assert "causal" not in split.message and "Likely cause" not in split.message
    result, _ = graded("bug_step_max_len_unchecked", ("lab5_decoder",))
    (test,) = [t for t in result.lab("lab5_decoder").tests if not t.passed]
    assert test.visibility == "hidden"
    assert test.message == "expected a ValueError, but your code raised IndexError"
    result, _ = graded("bug_linear_attention_quadratic", ("lab6_efficient_attention",))
    (test,) = [t for t in result.lab("lab6_efficient_attention").tests if not t.passed]
    assert "ran out of memory" in test.diagnosis and "(L, L)" in test.diagnosis


# ------------------------------------------------------------------------------------------
# correct submissions get no diagnosis
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CORRECT)
def test_correct_submission_gets_no_diagnosis(name, graded, rubric):
    """Graded on the labs the fixture changes (the others are the reference's own files,
    which the "solutions" case grades whole)."""
    result, captured = graded(name, None if name == "solutions"
                              else tuple(labs_changed(name, rubric)))
    assert result.score == result.max_score, failing(result)
    assert not any(t.diagnosis or not only_loss_curves(t.artifacts)
                   for lab in result.labs for t in lab.tests)
    # Forced: run the diagnoser on every (passing) test's calls as if it had failed.
    assert captured, "no test calls were captured"
    for lab, test, tol, calls in captured:
        forced = diagnose(lab, test, Mismatch("forced"), calls, tol, budget_s=30.0)
        assert forced == "", f"{name}: {lab}::{test} would be diagnosed as {forced!r}"


def test_stubs_get_no_diagnosis(graded):
    """Untouched exercises fail every test as "not implemented": nothing to diagnose."""
    result, _ = graded("exercises", ("lab1_attention", "lab3_positional"))
    assert result.score == 0
    assert not any(t.diagnosis or t.artifacts for _, t in failing(result))


# ------------------------------------------------------------------------------------------
# the diagnoser never breaks grading
# ------------------------------------------------------------------------------------------

TOL = Tolerance(atol=1e-5, rtol=1e-4)


def _sdpa_call(q, k, v, value, **kwargs):
    return RecordedCall("lab1_attention", {"op": "call", "target": "scaled_dot_product_attention",
                                           "args": [q, k, v], "kwargs": kwargs, "seed": 0},
                        value=value)


def test_diagnoser_errors_and_garbage_give_no_diagnosis(monkeypatch):
    q = torch.randn(2, 3, 4)
    calls = [_sdpa_call(q, q, q, value="not a tensor"),
             RecordedCall("lab1_attention", {"op": "probe"}),
             RecordedCall("lab1_attention", {"op": "call", "target": "no_such_function",
                                             "args": [], "kwargs": {}})]
    assert diagnose("lab1_attention", "t", Mismatch("x"), calls, TOL) == ""
    assert examine(lab="lab1_attention", test="t", exc=Mismatch("x"), calls=[object(), None],
                   tol=TOL, hidden=False) == ("", [])
    assert examine(lab="no_such_lab", test="t", exc=Mismatch("x"), calls=calls, tol=None,
                   hidden=False) == ("", [])

    class Exploding(Mistake):
        def matches(self, ctx):
            raise RuntimeError("boom")

    monkeypatch.setitem(__import__("grader.mistakes", fromlist=["_catalogues"])._catalogues,
                        "lab1_attention", [Exploding(id="x", name="x", hint="y")])
    good = _sdpa_call(q, q, q, value=(q, q))
    assert diagnose("lab1_attention", "t", Mismatch("x"), [good], TOL) == ""


def _catalogue_with_a_slow_mistake(monkeypatch, slow):
    class Slow(Mistake):
        def matches(self, ctx):
            slow()
            return False

    class Late(Mistake):
        def matches(self, ctx):
            return True

    import grader.mistakes as mistakes
    monkeypatch.setitem(mistakes._catalogues, "lab1_attention",
                        [Slow(id="s", name="s", hint="h"), Late(id="l", name="late", hint="h")])
    q = torch.randn(1, 2, 4)
    return _sdpa_call(q, q, q, value=(q, q))


def test_diagnosis_stops_at_its_time_budget(monkeypatch):
    def burn():                     # 0.2 s of this thread's CPU
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass

    call = _catalogue_with_a_slow_mistake(monkeypatch, burn)
    assert diagnose("lab1_attention", "t", Mismatch("x"), [call], TOL, budget_s=0.1) == ""
    assert diagnose("lab1_attention", "t", Mismatch("x"), [call], TOL, budget_s=600) == "late: h"


def test_a_loaded_machine_does_not_use_up_the_diagnosis_budget(monkeypatch):
    """The budget is the diagnosis's own CPU time: time off the CPU (a loaded machine kept
    the grading process waiting; here a sleep) is not the diagnosis's, and on a busy grader
    the student lost the diagnosis that a quiet one gave."""
    call = _catalogue_with_a_slow_mistake(monkeypatch, lambda: time.sleep(0.3))
    assert diagnose("lab1_attention", "t", Mismatch("x"), [call], TOL, budget_s=0.2) == "late: h"


def test_only_diagnosable_failures_are_examined():
    from grader.diagnose import diagnosable
    from grader.engine.student import StudentError
    assert diagnosable(Mismatch("x"))
    assert diagnosable(StudentError(kind="exception", type_name="RuntimeError"))
    assert diagnosable(AssertionError("expected a ValueError to be raised, but ..."))
    for kind in ("not_implemented", "timeout", "crash", "forbidden", "import"):
        assert not diagnosable(StudentError(kind=kind))
    assert not diagnosable(TypeError("cannot unpack"))


def test_forbidden_api_on_one_branch_is_the_lab_status_and_says_where(graded):
    """nanoGPT's fused path taken only when need_weights=False: found in the source before any
    test runs; the lab reads forbidden_api (not import_error), naming the file and line."""
    result, _ = graded("bug_forbidden_branch", ("lab1_attention", "lab2_multihead"))
    lab2 = result.lab("lab2_multihead")
    line = next(i for i, text in enumerate(
        (FIXTURES / "bug_forbidden_branch" / "lab2_multihead.py").read_text().splitlines(), 1)
        if "functional.scaled_dot_product_attention(" in text)
    assert lab2.status == "forbidden_api" and lab2.score == 0
    assert f"lab2_multihead.py:{line}: uses torch.nn.functional.scaled_dot_product_attention" \
        in lab2.message
    assert "branches the tests might not take" in lab2.message
    assert all(t.message == lab2.message and not t.passed for t in lab2.tests)
    assert result.lab("lab1_attention").score == result.lab("lab1_attention").max_score
    payload = gradescope_payload(result)
    assert payload["extra_data"]["labs"]["lab2_multihead"]["status"] == "forbidden_api"


def _mismatch(actual, expected, **kw) -> Mismatch:
    with pytest.raises(Mismatch) as info:
        assert_close(actual, expected, tol=TOL, **kw)
    return info.value


def test_unexplained_differences_are_put_in_words():
    """A failure the catalogue cannot name still says what differs: which rows, what kind of
    values, which axis sums to 1; hidden messages keep the words and drop every number."""
    gen = torch.Generator().manual_seed(0)
    w = torch.softmax(torch.randn(2, 6, 5, generator=gen), dim=-1)
    axes = ("batch", "seq_q", "seq_k")
    rows_off = w.clone()
    rows_off[:, 3] = 0.0
    m = _mismatch(rows_off, w, name="weights", axes=axes)
    assert "only at seq_q 3 (1 of 6)" in m.public and "only at seq_q 3 (1 of 6)" in m.hidden
    assert "your values are 0 where they should not be" in m.hidden

    m = _mismatch(torch.softmax(torch.log(w), dim=-2), w, name="weights", axes=axes)
    assert "your values sum to 1 along seq_q instead of seq_k" in m.hidden

    scaled = w * 1.5
    m = _mismatch(scaled, w, name="weights", axes=axes)
    assert "off by the same factor (1.5)" in m.public
    assert "off by the same factor (a scale?)" in m.hidden and "1.5" not in m.hidden

    w64 = w.double()
    with pytest.raises(Mismatch) as info:
        assert_close(w64 * (1 + 3e-8), w64, tol=Tolerance(atol=1e-12, rtol=1e-10),
                     name="weights", axes=axes)
    m = info.value
    assert "float32 rounding level" in m.hidden

    mask = torch.ones(3, 7, dtype=torch.bool).tril(4)
    m = _mismatch(torch.ones(3, 7, dtype=torch.bool).tril(), mask, name="mask",
                  axes=("seq_q", "seq_k"))
    assert "12 False that should be True" in m.hidden
    assert not re.search(r"expected|got -?\d", m.hidden)


def test_detached_gradients_are_not_named_when_the_forward_is_wrong():
    """The detached-gradients hint says the forward values are right: it may only be named
    when they are (zero input gradients from a wrong forward are another mistake)."""
    from grader.mistakes import gradients_detached, Context
    from grader.sandbox.protocol import grad_request
    q = torch.randn(1, 3, 4, dtype=torch.float64)
    req = grad_request("scaled_dot_product_attention", [q, q.flip(1), q * 2], {},
                       [torch.ones(1, 3, 4, dtype=torch.float64), None])
    ctx = Context(lab="lab1_attention", test="t", exc=Mismatch("x"), calls=[], tol=TOL)
    ref = ctx.run(__import__("grader.mistakes", fromlist=["Impl"]).Impl("lab1_attention"),
                  RecordedCall("lab1_attention", req))
    assert ref.ok, ref.error
    zero_grads = {**ref.value, "input_grads": [torch.zeros_like(g) for g in
                                                ref.value["input_grads"]]}
    right_forward = RecordedCall("lab1_attention", req, value=zero_grads)
    assert gradients_detached(Context(lab="lab1_attention", test="t", exc=Mismatch("x"),
                                      calls=[right_forward], tol=TOL))
    wrong = {**zero_grads, "output": [torch.zeros_like(o) for o in ref.value["output"]]}
    wrong_forward = RecordedCall("lab1_attention", req, value=wrong)
    assert not gradients_detached(Context(lab="lab1_attention", test="t", exc=Mismatch("x"),
                                          calls=[wrong_forward], tol=TOL))


def test_shape_mismatch_names_axes_and_suggests_transpose():
    with pytest.raises(Mismatch) as info:
        assert_close(torch.zeros(2, 5, 4, 8), torch.zeros(2, 4, 5, 8), tol=TOL, name="q",
                     axes=("batch", "heads", "seq", "d_head"))
    text = str(info.value)
    assert "expected shape (batch, heads, seq, d_head) = (2, 4, 5, 8), got (2, 5, 4, 8)" in text
    assert "transpose(1, 2)" in text


# ------------------------------------------------------------------------------------------
# the HTML report
# ------------------------------------------------------------------------------------------


class Page(HTMLParser):
    """Rows (one per test, with its row of pictures) with their text and images."""

    def __init__(self):
        super().__init__()
        self.rows, self.row, self.depth = [], None, 0
        self.all_imgs = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and "data-test" in attrs:
            self.row = {"test": attrs["data-test"], "visibility": attrs["data-visibility"],
                        "class": attrs.get("class", ""), "text": [], "imgs": []}
            self.rows.append(self.row)
        if tag == "tr" and "data-pictures-for" in attrs:    # a test's pictures: its next row
            assert self.rows and self.rows[-1]["test"] == attrs["data-pictures-for"]
            self.row = self.rows[-1]
        if tag == "img":
            self.all_imgs.append(attrs.get("src", ""))
            if self.row is not None:
                self.row["imgs"].append(attrs.get("src", ""))
        if tag in ("script", "link", "iframe"):
            raise AssertionError(f"the report must be self-contained, found <{tag}>")

    def handle_endtag(self, tag):
        if tag == "tr":
            self.row = None

    def handle_data(self, data):
        if self.row is not None:
            self.row["text"].append(data)


def valid_png(data: bytes) -> bool:
    """PNG signature, then chunks with correct CRCs, IHDR first and IEND last."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return False
    pos, kinds = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            return False
        kinds.append(kind)
        pos += 12 + length
    return kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds


def parse(html_text: str) -> Page:
    page = Page()
    page.feed(html_text)
    page.close()
    return page


VALUES = re.compile(r"expected -?\d|got -?\d|worst at|max error")


@pytest.mark.parametrize("fixture", ["bug_mask_inverted", "bug_sin_cos_swapped"])
def test_html_report_renders(fixture, graded, tmp_path):
    breaks = tuple(expectation(fixture).get("breaks") or ())
    result, _ = graded(fixture, breaks)
    path = write_feedback_html(result, tmp_path / "feedback.html")
    page = parse(path.read_text(encoding="utf-8"))
    tests = [(lab.name, t) for lab in result.labs for t in lab.tests]
    assert [r["test"] for r in page.rows] == [t.name for _, t in tests]
    assert page.all_imgs, "a failing public test should have a picture"
    for row, (_, t) in zip(page.rows, tests, strict=False):
        text = " ".join(row["text"])
        assert ("pass" if t.passed else "FAIL") in text
        if t.diagnosis:
            assert name_of(t.diagnosis) in text
        if t.visibility == "hidden":
            assert not row["imgs"], f"hidden test {t.name} shows a picture"
            assert not VALUES.search(text), f"hidden test {t.name} shows values: {text}"
        for src in row["imgs"]:
            assert src.startswith("data:image/png;base64,")
            assert valid_png(base64.b64decode(src.split(",", 1)[1], validate=True))
    assert all(src in [s for r in page.rows for s in r["imgs"]] for src in page.all_imgs)
    # results.json and every other serialised view leave the arrays out
    as_json = json.dumps(result.to_dict()) + json.dumps(gradescope_payload(result))
    assert "artifacts" not in as_json


def test_pictures_of_attention_and_positional_encoding(graded):
    for fixture, kind in (("bug_softmax_dim", "attention"), ("bug_exponent_i", "positional")):
        result, _ = graded(fixture, tuple(expectation(fixture)["breaks"]))
        pics = [p for _, t in failing(result) for p in t.artifacts]
        assert pics and all(p["kind"] == kind for p in pics), fixture
        for p in pics:
            assert p["student"].dim() == 2 and p["student"].shape == p["expected"].shape
            assert torch.allclose(p["difference"], p["student"] - p["expected"], equal_nan=True)


def test_hidden_artifacts_are_never_drawn(tmp_path):
    """A hand-built result carrying arrays on a hidden test: the page still shows none."""
    pic = {"kind": "attention", "title": "secret", "student": torch.rand(3, 3),
           "expected": torch.rand(3, 3), "difference": torch.zeros(3, 3), "rows": "q", "cols": "k"}
    LabResult, SubmissionResult, TestResult = (results.LabResult, results.SubmissionResult,
                                               results.TestResult)
    lab = LabResult(name="lab1_attention", title="Attention", file="lab1_attention.py", tests=[
        TestResult(lab="lab1_attention", name="test_public", description="d", visibility="public",
                   max_score=1, passed=False, message="m <b>", diagnosis="x: y", artifacts=[pic]),
        TestResult(lab="lab1_attention", name="test_hidden", description="d", visibility="hidden",
                   max_score=1, passed=False, message="m", diagnosis="x: y", artifacts=[pic]),
    ])
    text = render_feedback_html(SubmissionResult(submission="s<1>", labs=[lab]))
    page = parse(text)
    assert len(page.rows[0]["imgs"]) == 1 and not page.rows[1]["imgs"]
    assert "m <b>" not in text and "m &lt;b&gt;" in text and "s&lt;1&gt;" in text
    assert "artifacts" not in json.dumps(lab.to_dict())


TINY_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")


def test_cli_grade_html_and_feedback_command(graded, monkeypatch, tmp_path):
    from grader import cli
    result, _ = graded("bug_sin_cos_swapped", ("lab3_positional",))
    for command in ("grade", "feedback"):       # what each command module grades with
        monkeypatch.setattr(f"grader.cli.{command}.grade_submission", lambda *a, **k: result)
    monkeypatch.setattr("grader.outputs.html.picture_png", lambda picture: TINY_PNG)
    assert cli.main(["grade", "whatever", "--out", str(tmp_path / "a"), "--html"]) == 0
    assert cli.main(["feedback", "whatever", "--out", str(tmp_path / "b")]) == 0
    for folder in ("a", "b"):
        page = parse((tmp_path / folder / "feedback.html").read_text(encoding="utf-8"))
        assert len(page.rows) == len(result.lab("lab3_positional").tests)
        assert page.all_imgs and all(valid_png(base64.b64decode(src.split(",", 1)[1]))
                                     for src in page.all_imgs)
    assert (tmp_path / "a" / "results.json").is_file()


def test_mistake_implementations_without_the_mistake_are_the_reference():
    """The switches of the trusted wrong implementations, all off, give the reference."""
    from grader.mistakes.lab1_attention import attention, causal
    from grader.mistakes.lab2_multihead import mha_class
    from grader.mistakes.lab3_positional import sinusoidal_class, table
    from grader.mistakes.lab4_transformer_block import block_class
    from grader.engine.reference import load_reference

    g = torch.Generator().manual_seed(0)
    ref1 = load_reference("lab1_attention")
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    mask = torch.rand(2, 1, 5, 5, generator=g) < 0.5
    mask[0, 0, 2] = False                                  # a row with every key blocked
    for m in (None, mask):
        got, exp = attention(q, k, v, mask=m), ref1.scaled_dot_product_attention(q, k, v, mask=m)
        assert all(torch.equal(a, b) for a, b in zip(got, exp, strict=False))
    assert torch.equal(causal(3, 7), ref1.causal_mask(3, 7))

    ref3 = load_reference("lab3_positional")
    for d in (6, 7):
        assert torch.equal(table(9, d, 100.0), ref3.sinusoidal_positional_encoding(9, d, 100.0))
    right = sinusoidal_class(ref3.SinusoidalPositionalEncoding, table)(8, max_len=12)
    assert torch.equal(right.pe, ref3.SinusoidalPositionalEncoding(8, max_len=12).pe)

    ref2 = load_reference("lab2_multihead")
    torch.manual_seed(1)
    a = ref2.MultiHeadAttention(8, 2)
    b = mha_class(ref2.MultiHeadAttention)(8, 2)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 5, 8, generator=g)
    assert all(torch.allclose(s, t) for s, t in zip(a(x, x, x, mask=mask[:, :, :5]),
                                                   b(x, x, x, mask=mask[:, :, :5]), strict=False))

    ref4 = load_reference("lab4_transformer_block")
    for norm_first in (False, True):
        a = ref4.TransformerBlock(8, 2, 16, norm_first=norm_first, activation="gelu")
        b = block_class(ref4.TransformerBlock)(8, 2, 16, norm_first=norm_first, activation="gelu")
        b.load_state_dict(a.state_dict())
        causal_mask = torch.ones(5, 5, dtype=torch.bool).tril()
        assert torch.allclose(a(x, mask=causal_mask), b(x, mask=causal_mask))


def test_lab6_mistake_implementations_without_the_mistake_are_the_reference():
    """Lab 6's wrong implementations, every switch off, give the reference's values."""
    from grader.mistakes.lab6_efficient_attention import (
        chunked, features, linear, quadratic, window_attention, window_mask)
    from grader.engine.reference import load_reference

    ref = load_reference("lab6_efficient_attention")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 4, generator=g, dtype=torch.float64) for _ in range(3))
    pad = torch.rand(2, 1, 1, 9, generator=g) < 0.6
    pad[1] = False                                         # every key padded
    for causal in (False, True):
        for chunk in (1, 4, 20):
            assert torch.equal(chunked(q[..., :6, :], k, v, causal, pad, chunk),
                               ref.chunked_attention(q[..., :6, :], k, v, causal, pad, chunk))
        assert torch.equal(linear(q, k, v, causal), ref.linear_attention(q, k, v, causal))
        assert torch.equal(quadratic(q, k, v, causal), ref.linear_attention_quadratic(q, k, v, causal))
    assert torch.equal(features(q), ref.elu_feature_map(q))
    for window in (1, 3, 9, 12):
        assert torch.equal(window_mask(9, window), ref.sliding_window_mask(9, window))
        assert torch.allclose(window_attention(q, k, v, window),
                              ref.sliding_window_attention(q, k, v, window), atol=1e-12, rtol=0)
    narrow = v[..., :2]                                    # values narrower than the queries
    for like_q in (lambda: chunked(q, k, narrow, acc_like_q=True),
                   lambda: window_attention(q, k, narrow, 3, out_like_q=True)):
        with pytest.raises(RuntimeError):
            like_q()
    assert torch.equal(chunked(q, k, v, acc_like_q=True), ref.chunked_attention(q, k, v))


# ------------------------------------------------------------------------------------------
# one summary per lab: a diagnosis shared by many failed tests is written out once
# ------------------------------------------------------------------------------------------

SOFTMAX = ("softmax over the wrong axis: normalise each query's scores over the keys "
           "(the last axis, dim=-1); each row of the weights must sum to 1")
MASK = "mask polarity inverted: True in the mask means the key may be attended to"


def _case(name, *, passed=False, diagnosis="", visibility="public", lab="lab1_attention",
          message="weights: wrong values"):
    return results.TestResult(lab=lab, name=name, description=f"{name} does things",
                              visibility=visibility, max_score=1, passed=passed,
                              message="" if passed else message, diagnosis=diagnosis)


def _shared_result(n_shared: int = 6, diagnosis: str = SOFTMAX) -> results.SubmissionResult:
    """lab1: n_shared failures with one diagnosis (the last hidden), one unique diagnosis,
    one failure without any, one pass; lab2: one pass; lab3: one failure."""
    lab1 = results.LabResult(name="lab1_attention", title="Attention", file="lab1_attention.py")
    lab1.tests = [_case("test_ok", passed=True)]
    lab1.tests += [_case(f"test_shared_{i}", diagnosis=diagnosis,
                         visibility="hidden" if i == n_shared - 1 else "public")
                   for i in range(n_shared)]
    lab1.tests += [_case("test_unique", diagnosis=MASK), _case("test_plain")]
    lab2 = results.LabResult(name="lab2_multihead", title="Multi-head", file="lab2_multihead.py",
                             tests=[_case("test_mha", passed=True, lab="lab2_multihead")])
    lab3 = results.LabResult(name="lab3_positional", title="Positions", file="lab3_positional.py",
                             tests=[_case("test_pe", lab="lab3_positional", diagnosis=MASK)])
    return results.SubmissionResult(submission="ada", labs=[lab1, lab2, lab3])


class Links(HTMLParser):
    """Every element id, every <a href>, and the text inside each element with an id."""

    def __init__(self):
        super().__init__()
        self.ids, self.hrefs, self.stack = [], [], []
        self.text: dict[str, list[str]] = {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.append(attrs["id"])
            self.text[attrs["id"]] = []
        if tag == "a" and "href" in attrs:
            self.hrefs.append(attrs["href"])
        self.stack.append((tag, attrs.get("id")))

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        for _, ident in self.stack:
            if ident:
                self.text[ident].append(data)


def test_shared_diagnosis_is_summarised_once_per_lab():
    from grader.outputs.text import shared_causes
    result = _shared_result()
    lab1 = result.lab("lab1_attention")
    causes = shared_causes(lab1)
    assert [(c.name, c.hint, [t.name for t in c.tests]) for c in causes] == [
        ("softmax over the wrong axis", SOFTMAX.split(": ", 1)[1],
         [f"test_shared_{i}" for i in range(6)])]
    assert shared_causes(result.lab("lab3_positional")) == []     # one test: not shared

    text = render_feedback_html(result)
    page = parse(text)
    assert html.unescape(text).count(SOFTMAX.split(": ", 1)[1]) == 1, "the hint is written once"
    lab1_text = " ".join(" ".join(Links_of(text).text["lab1_attention"]).split())
    assert "Likely cause: " + SOFTMAX + " (seen in 6 tests)" in lab1_text
    rows = {r["test"]: " ".join(" ".join(r["text"]).split()) for r in page.rows}
    for i in range(6):
        assert "Diagnosis: see 'softmax over the wrong axis' above" in rows[f"test_shared_{i}"]
    assert "Diagnosis: " + MASK in rows["test_unique"]         # unique: still in full
    assert "Diagnosis" not in rows["test_plain"] and "Diagnosis" not in rows["test_ok"]
    assert "Likely cause" not in " ".join(Links_of(text).text["lab3_positional"])
    # the reference links to the summary, and the summary is inside lab 1's section
    links = Links_of(text)
    refs = {h for h in links.hrefs if h.startswith("#cause-")}
    assert len(refs) == 1 and refs.pop()[1:] in links.ids
    lab1_text = " ".join(" ".join(links.text["lab1_attention"]).split())
    assert lab1_text.index("Likely cause") < lab1_text.index("test_ok")


def Links_of(text: str) -> Links:
    links = Links()
    links.feed(text)
    links.close()
    return links


def test_report_has_a_table_of_contents_and_links_between_labs():
    text = render_feedback_html(_shared_result())
    links = Links_of(text)
    labs = ["lab1_attention", "lab2_multihead", "lab3_positional"]
    assert all(lab in links.ids for lab in labs) and "contents" in links.ids
    toc = " ".join(links.text["contents"])
    for lab in labs:                                   # contents: each lab, its score
        assert lab in toc
    toc = " ".join(toc.split())
    assert "1 / 9" in toc and "1 / 1" in toc and "0 / 1" in toc
    assert [h for h in links.hrefs if h in {f"#{lab}" for lab in labs}][:3] == \
        [f"#{lab}" for lab in labs]
    # each section links to the contents, the previous and the next lab
    for i, lab in enumerate(labs):
        section = Links()
        start = text.index(f'<section class="lab" id="{lab}"')
        section.feed(text[start:text.index("</section>", start)])
        assert "#contents" in section.hrefs
        others = {f"#{other}" for other in labs} & set(section.hrefs)
        assert others == {f"#{labs[j]}" for j in (i - 1, i + 1) if 0 <= j < len(labs)}
    assert all(h[1:] in links.ids for h in links.hrefs if h.startswith("#"))


def test_report_size_shrinks_when_many_tests_share_a_diagnosis():
    """29 failures with one long diagnosis (the case of issue #16): the hint once, and the
    page grows by a short reference per test, not by the diagnosis per test."""
    hint = "h" * 2000
    shared = render_feedback_html(_shared_result(29, diagnosis=f"softmax over the wrong axis: {hint}"))
    plain = render_feedback_html(_shared_result(29, diagnosis=""))
    assert shared.count(hint) == 1 and shared.count("softmax over the wrong axis") == 30
    assert len(shared) - len(plain) < len(hint) + 29 * 250


def test_text_outputs_summarise_shared_diagnoses():
    """The terminal table and Gradescope's results.json: the hint once per lab."""
    import io

    from rich.console import Console

    from grader.outputs.terminal import render_table

    result = _shared_result()
    buffer = io.StringIO()
    render_table(result, console=Console(file=buffer, width=300, color_system=None))
    out = buffer.getvalue()
    hint = SOFTMAX.split(": ", 1)[1]
    assert out.count(hint) == 1 and "(seen in 6 tests)" in out
    assert out.index("lab1_attention - Attention: 1/9") < out.index("Likely cause: ") \
        < out.index("test_shared_0") < out.index("lab2_multihead")
    assert out.count("Diagnosis: see 'softmax over the wrong axis' above") == 6
    assert out.count(MASK) == 2                         # unique in lab 1, and lab 3's

    payload = gradescope_payload(result)
    outputs = {t["name"]: t["output"] for t in payload["tests"]}
    assert sum(hint in o for o in outputs.values()) == 1
    first = outputs["lab1_attention: test_shared_0"]
    assert "Diagnosis: " + SOFTMAX in first and "seen in 6 tests" in first
    for i in range(1, 6):
        assert ("Diagnosis: softmax over the wrong axis (the hint is in "
                "lab1_attention: test_shared_0)") in outputs[f"lab1_attention: test_shared_{i}"]
    assert "Diagnosis: " + MASK in outputs["lab1_attention: test_unique"]
    assert "Diagnosis: " + MASK in outputs["lab3_positional: test_pe"]


def test_gradescope_hint_goes_to_a_public_test_before_a_hidden_one():
    """A hidden test's output shows only after grades are published: a public test that
    shares the diagnosis must not send the student there for the hint."""
    result = _shared_result(3)
    lab1 = result.lab("lab1_attention")
    lab1.tests[1].visibility = "hidden"                # test_shared_0 hidden, 1 public, 2 hidden
    outputs = {t["name"]: t["output"] for t in gradescope_payload(result)["tests"]}
    assert "Diagnosis: " + SOFTMAX in outputs["lab1_attention: test_shared_1"]
    assert "the hint is in lab1_attention: test_shared_1" in outputs["lab1_attention: test_shared_0"]


@pytest.mark.parametrize("rows, cols", [(3, 3), (5, 7), (16, 16), (64, 64), (1, 64)])
def test_heatmaps_are_drawn_large_enough_to_read(rows, cols):
    """Each panel at least 320 px on its longer side (240 for a 3x3), never shrunk by the
    page: two panels a row, so the whole picture fits the report's width (72em)."""
    import io

    from PIL import Image

    from grader.outputs.html import PAGE_PX, heatmap_cell_px, picture_png

    gen = torch.Generator().manual_seed(0)
    student = torch.rand(rows, cols, generator=gen)
    expected = torch.rand(rows, cols, generator=gen)
    picture = {"kind": "attention", "title": "t", "student": student, "expected": expected,
               "difference": student - expected, "rows": "query", "cols": "key"}
    image = Image.open(io.BytesIO(picture_png(picture)))
    cell = heatmap_cell_px(rows, cols)
    side = max(rows, cols) * cell
    assert side >= (240 if max(rows, cols) == 3 else 320) and cell >= 5
    assert image.width <= PAGE_PX                   # shown at its own size, never scaled
    assert image.width >= 2 * cols * cell and image.height >= 2 * rows * cell   # 2 x 2 grid
    page = render_feedback_html(results.SubmissionResult(submission="s", labs=[results.LabResult(
        name="lab1_attention", title="A", file="lab1_attention.py", tests=[results.TestResult(
            lab="lab1_attention", name="test_x", description="", visibility="public",
            max_score=1, passed=False, message="m", artifacts=[picture])])]))
    # the picture gets a row of its own, the table's full width, at its natural size
    assert re.search(r'<tr class="pictures failed" data-pictures-for="test_x"><td colspan="4">'
                     rf'<figure class="picture"><img width="{image.width}" '
                     rf'height="{image.height}"', page)
    assert "image-rendering: pixelated" in page
    assert parse(page).rows[0]["imgs"], "the picture belongs to its test"


def test_lab7_mistake_implementations_without_the_mistake_are_the_reference():
    """Lab 7's wrong implementations, every switch off, give the reference's values; each
    switch on changes them (a mistake that changed nothing could never be named)."""
    from grader.mistakes.lab7_relative_positions import (
        bias, comparison, frequencies, rope, scores, slopes)
    from grader.engine.reference import load_reference

    ref = load_reference("lab7_relative_positions")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64)
    q, k = x[..., :4, :], x[..., 1:, :]
    positions = torch.randint(0, 10**5, (2, 1, 5), generator=g)
    assert torch.equal(frequencies(8), ref.rope_frequencies(8))
    assert torch.equal(rope(x, positions), ref.apply_rope(x, positions))
    assert torch.equal(scores(q, k, positions[..., :4], positions[..., 1:]),
                       ref.rope_scores(q, k, positions[..., :4], positions[..., 1:]))
    assert not torch.allclose(rope(x, positions, pairing="rotate_half"), ref.apply_rope(x, positions))
    for angles_in in ("float32", "float32_all", "float32_cast", "theta_float32"):
        assert not torch.allclose(rope(x, positions, angles_in=angles_in), ref.apply_rope(x, positions),
                                  atol=1e-6, rtol=0)
    cq, ck = x[0, 0], x[1, 0]
    for heads in (3, 4):
        mine, theirs = comparison(cq, ck, 8, 1000, heads), ref.extrapolation_comparison(cq, ck, 8, 1000, heads)
        assert list(mine) == list(theirs)
        for name in theirs:
            assert mine[name].keys() == theirs[name].keys(), name
            for key, value in theirs[name].items():
                same = (torch.equal(mine[name][key], value) if isinstance(value, torch.Tensor)
                        else mine[name][key] == value)
                assert same, (name, key)
    for switch in ({"scaled": False}, {"direction": -1.0}, {"reverse": True}, {"any_n": True},
                   {"alibi_per_key": True}, {"by_size": True}, {"first_power": 0}):
        scheme = "rope" if set(switch) & {"scaled", "direction"} else "alibi"
        wrong = comparison(cq, ck, 8, 1000, 3, **switch)[scheme]["weights_past"]
        assert not torch.allclose(wrong, ref.extrapolation_comparison(cq, ck, 8, 1000, 3)[scheme]["weights_past"])
    for exponent in ("i", "4i"):
        assert not torch.allclose(frequencies(8, exponent=exponent), ref.rope_frequencies(8))
    for heads in (1, 3, 6, 8, 12):
        assert torch.equal(slopes(heads), ref.alibi_slopes(heads))
        for seq_q, seq_k in ((4, 4), (2, 7), (6, 3)):
            assert torch.equal(bias(heads, seq_q, seq_k), ref.alibi_bias(heads, seq_q, seq_k))
    assert not torch.equal(slopes(6, reverse=True), ref.alibi_slopes(6))
    assert not torch.equal(slopes(6, any_n=True), ref.alibi_slopes(6))
    assert not torch.equal(slopes(6, by_size=True), ref.alibi_slopes(6))
    assert torch.equal(slopes(8, by_size=True), ref.alibi_slopes(8))    # already sorted
    assert not torch.equal(slopes(8, first_power=0), ref.alibi_slopes(8))
    assert not torch.equal(bias(2, 3, 3, sign=1.0), ref.alibi_bias(2, 3, 3))
    assert not torch.equal(bias(2, 2, 5, top_left=True), ref.alibi_bias(2, 2, 5))
    for origin in ("first", "last"):
        assert not torch.equal(bias(2, 3, 3, per_key=origin), ref.alibi_bias(2, 3, 3))


def _first_paragraph(doc: str) -> str:
    import inspect
    return " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())


def test_feedback_of_dot_titles_the_folder_takes_labs_and_keeps_whole_sentences(tmp_path,
                                                                               monkeypatch):
    """``grader feedback . --lab A --lab B`` (#29): titled with the folder's own name, both
    labs and only them, each description the docstring's whole first paragraph (not its
    first line, cut mid-sentence), and a footer that promises pictures only when the page
    has some (lab 1 here passes: none)."""
    import importlib.util

    from grader.cli import main
    folder = tmp_path / "alice"
    folder.mkdir()
    for lab in ("lab1_attention", "lab3_positional"):
        (folder / f"{lab}.py").write_bytes(((paths.KIT / "solutions") / f"{lab}.py").read_bytes())
    monkeypatch.chdir(folder)
    out = tmp_path / "out"
    assert main(["feedback", ".", "--out", str(out), "--public",
                 "--lab", "lab1_attention", "--lab", "lab3_positional"]) == 0
    page = (out / "feedback.html").read_text()
    assert "<h1>Feedback for alice</h1>" in page
    assert 'id="lab1_attention"' in page and 'id="lab3_positional"' in page
    assert 'id="lab2_multihead"' not in page
    spec = importlib.util.spec_from_file_location(
        "suite_lab3", paths.SUITES / "public" / "test_lab3_positional.py")
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    shown = dict(re.findall(r'data-test="(test_\w+)".*?<div class="desc">(.*?)</div>', page))
    assert shown
    for name, desc in shown.items():
        fn = getattr(suite, name, None)
        if fn is not None:
            assert html.unescape(desc) == _first_paragraph(fn.__doc__), name
    assert "Pictures show" not in page


def test_calls_that_fit_two_mistakes_name_neither(monkeypatch):
    """Never a guess: when a test's calls fit two catalogued mistakes (a greedy decoding on
    weights a fresh course secret drew fitted "PAD keys not masked" and "cross-attention
    keys from the decoder"), the test alone names none of them."""
    class Fits(Mistake):
        def matches(self, ctx):
            return True

    import grader.mistakes as mistakes
    monkeypatch.setitem(mistakes._catalogues, "lab1_attention",
                        [Fits(id="a", name="first", hint="h"), Fits(id="b", name="second", hint="h")])
    q = torch.randn(1, 2, 4)
    call = _sdpa_call(q, q, q, value=(q, q))
    assert diagnose("lab1_attention", "t", Mismatch("x"), [call], TOL) == ""


def test_an_ambiguous_test_takes_the_name_its_lab_settles():
    """After a run, a failed test whose calls fit several mistakes names the one another
    failed test of its lab names alone; with none (or several) named, it stays silent."""
    from grader.engine.plugin import GradingPlugin
    from grader.results import TestResult

    def result(lab, name, diagnosis=""):
        return TestResult(lab=lab, name=name, description="", visibility="hidden", max_score=1,
                          passed=False, diagnosis=diagnosis)

    plugin = GradingPlugin(rubric=None, session=None)
    alone, both, neither, elsewhere = (result("lab8", "t1", "pad: h"), result("lab8", "t2"),
                                       result("lab8", "t3"), result("lab7", "t4"))
    plugin.outcomes = [alone, both, neither, elsewhere]
    plugin.ambiguous = [(both, ["cross: h", "pad: h"]), (neither, ["cross: h", "other: h"]),
                        (elsewhere, ["pad: h", "cross: h"])]
    plugin.settle_diagnoses()
    assert [t.diagnosis for t in plugin.outcomes] == ["pad: h", "pad: h", "", ""]
    assert plugin.ambiguous == []


def test_a_crash_names_only_the_mistake_that_causes_it():
    """Two crashes are one mistake's only when they are the same crash: a (T_new, T_new)
    mask's broadcast error is not the join error of a cache concatenated on the wrong axis
    (#42: that was once named for it), nor is an IndexError a ValueError."""
    from grader.engine.failures import StudentError
    from grader.mistakes import Result, same_answer

    broadcast = ("RuntimeError", "The size of tensor a (12) must match the size of tensor b "
                 "(4) at non-singleton dimension 3")
    join = RuntimeError("Sizes of tensors must match except in dimension 1. Expected size 8 "
                        "but got size 4 for tensor number 1 in the list.")
    tol = Tolerance(atol=1e-5, rtol=1e-5)
    for (type_name, message), replayed, same in [
            (broadcast, join, False),
            (broadcast, RuntimeError("The size of tensor a (7) must match the size of tensor "
                                     "b (3) at non-singleton dimension 3"), True),
            (("RuntimeError", join.args[0]), join, True),
            (("IndexError", "index out of range in self"), ValueError("too long"), False)]:
        call = RecordedCall(lab="lab5_decoder", req={}, error=StudentError(
            kind="exception", type_name=type_name, message=message))
        assert same_answer(call, Result(error=replayed), tol) is same, (message, replayed)


# ------------------------------------------------------------------------------------------
# code in another style: the whole diagnosis, and the near misses it refuses (#42)
# ------------------------------------------------------------------------------------------

ALIBI_PER_KEY = (
    "ALiBi bias per key, not per distance: the contract's bias is -slope * |i + seq_k - "
    "seq_q - j|; slope * j (growing with the key index, as BLOOM and MPT write it) differs "
    "from it by a constant in each row only on the keys up to the query: under a causal "
    "softmax the weights are the same, without a mask they are not; alibi_bias must return "
    "the distance form")
ROPE_FLOAT32 = (
    "RoPE angles computed in float32: the angles position * theta_i lose precision in "
    "float32: near 10^5 an angle keeps only ~3 decimals, and a float32 theta_i "
    "(rope_frequencies(d) without dtype=x.dtype) carries a rounding of up to 6e-8 of itself, "
    "which the position multiplies; compute theta and the angles in float64 for float64 "
    "inputs (dtype=x.dtype, positions.to(x.dtype), no x.float())")
OUTPUT_LIKE_Q = (
    "values narrower than the queries: the output's last dim is the values' width: "
    "(..., Lq, dv) with dv = v.size(-1), which may differ from d = q.size(-1); an "
    "accumulator or output made with torch.zeros_like(q) or empty_like(q) has the queries' "
    "width, so build it from v's (q.shape[:-1] + (v.size(-1),))")
WINDOW_BELOW_ONE = (
    "a window below 1 not refused: sliding_window_attention must check its window before "
    "using it: a window below 1 (0 or negative) leaves every query without a key, so raise a "
    "ValueError that says so first, instead of letting a division, a range or a slice by the "
    "window fail on it (or return empty rows)")
SLOPES_SORTED = (
    "ALiBi slopes sorted by size: for n heads not a power of two Press et al. list first the "
    "slopes of m, the largest power of two below n, then the extra slopes of 2m ([0::2]) "
    "after them; sorting them by size puts the extra ones among the others, so most heads "
    "get another head's slope")
SLOPES_START_AT_ONE = (
    "ALiBi slopes start at 1: the geometric sequence starts at its ratio: head h (from 0) has "
    "slope (2 ** (-8 / n)) ** (h + 1), so the first head has 2 ** (-8 / n) and the last "
    "2 ** -8 (with 8 heads 1/2 .. 1/256); raising it to h from 0 gives head 0 slope 1 and "
    "shifts every head by one step")
LAB6 = "lab6_efficient_attention"
LAB7 = "lab7_relative_positions"
ALIBI_TESTS = {"test_alibi_slopes_power_of_two_and_not", "test_alibi_bias_matches_reference",
               "test_alibi_slopes_many_head_counts", "test_alibi_bias_more_queries_than_keys",
               "test_extrapolation_comparison_far_out_and_checks"}
# fixture -> the lab it breaks, the tests that fail there, and the diagnosis each gives
ANOTHER_STYLE = {
    # the public comparison has 4 heads (a power of two: sorted is the same order) and passes
    "bug_alibi_slopes_sorted": (LAB7, ALIBI_TESTS, SLOPES_SORTED),
    "bug_alibi_slopes_start_at_one": (LAB7, ALIBI_TESTS | {
        "test_extrapolation_comparison_reports_each_scheme"}, SLOPES_START_AT_ONE),
    # a crash on every call with values narrower than the queries (dv 4 or 5, d 8)
    "bug_chunked_output_like_q": (LAB6, {
        "test_chunked_matches_full_attention", "test_chunked_causal_more_keys_than_queries",
        "test_chunked_key_padding_mask_and_all_blocked_rows",
        "test_chunked_float64_with_batch_and_heads", "test_chunked_large_scores_numerically_stable",
        "test_chunked_rows_of_very_negative_scores", "test_chunked_gradients_match_full_attention"},
        OUTPUT_LIKE_Q),
    "bug_window_output_like_q": (LAB6, {
        "test_sliding_window_matches_full_attention_with_band_mask",
        "test_sliding_window_edge_windows"}, OUTPUT_LIKE_Q),
    # once only "expected a ValueError, but your code raised ZeroDivisionError"
    "bug_window_below_one_unchecked": (LAB6, {"test_sliding_window_rejects_window_below_one"},
                                       WINDOW_BELOW_ONE),
    "bug_alibi_bias_per_key": ("lab7_relative_positions", {
        "test_alibi_bias_matches_reference", "test_alibi_bias_more_queries_than_keys"},
        ALIBI_PER_KEY),
    # theta rounded, the angles float64: apply_rope far out fails; rope_scores far out
    # fails too for some courses' hidden inputs (the rounding times the position), never
    # without the same diagnosis (MAY_FAIL); it once had no diagnosis at all
    "bug_rope_theta_float32": ("lab7_relative_positions", {
        "test_apply_rope_float64_large_positions"}, ROPE_FLOAT32),
    # the public test's differences are float32-sized: once named "float64 results only
    # float32-precise" there and nothing on the hidden tests
    "bug_rope_angles_float32_cast": ("lab7_relative_positions", {
        "test_rope_scores_shift_invariant_far_beyond_any_table",
        "test_apply_rope_float64_large_positions", "test_rope_scores_batched_positions_far_out",
        "test_extrapolation_comparison_far_out_and_checks"}, ROPE_FLOAT32),
}


# Tests a fixture fails or passes by the course's hidden inputs (its secret: every clone
# has its own); when one fails, it names the fixture's diagnosis all the same.
MAY_FAIL = {"bug_rope_theta_float32": {"test_rope_scores_batched_positions_far_out"}}


@pytest.mark.parametrize("fixture", sorted(ANOTHER_STYLE))
def test_code_in_another_style_gets_the_whole_diagnosis(fixture, graded):
    lab, tests, diagnosis = ANOTHER_STYLE[fixture]
    result, _ = graded(fixture, (lab,))
    fails = {t.name: t.diagnosis for t in result.lab(lab).tests if not t.passed}
    for name in MAY_FAIL.get(fixture, ()):
        if name in fails:
            tests = {*tests, name}
    assert fails == dict.fromkeys(tests, diagnosis)


def _recorded(lab, target, *args, value=None, error=None, **kwargs):
    return RecordedCall(lab, {"op": "call", "target": target, "args": list(args),
                              "kwargs": kwargs, "seed": 0}, value=value, error=error)


def test_alibi_bias_per_key_is_named_only_for_its_own_values():
    """slope * j (from the first key, or 0 at the last) is named; the same with the slopes
    reversed, decreasing with j, or a bonus for distance (the sign mistake) is not."""
    from grader.engine.reference import load_reference
    lab = "lab7_relative_positions"
    slopes = load_reference(lab).alibi_slopes(4).view(-1, 1, 1)
    keys = torch.arange(7, dtype=torch.float32).expand(3, 7)
    distance = (torch.arange(3).unsqueeze(1) + 4 - torch.arange(7)).abs().float()
    tol = Tolerance(atol=1e-5, rtol=1e-4)

    def diagnosis(bias):
        return diagnose(lab, "t", Mismatch("x"), [_recorded(lab, "alibi_bias", 4, 3, 7,
                                                            value=bias)], tol)

    assert diagnosis(slopes * keys) == ALIBI_PER_KEY
    assert diagnosis(slopes * (keys - 6)) == ALIBI_PER_KEY
    for near_miss in (slopes.flip(0) * keys, -slopes * keys, slopes * (keys + 1) * 1.01):
        assert name_of(diagnosis(near_miss)) != name_of(ALIBI_PER_KEY)
    assert name_of(diagnosis(slopes * distance)) == "ALiBi bias is a bonus, not a penalty"


def test_rope_angles_float32_is_named_only_for_float32_angles():
    """apply_rope far out from a float32 theta is named; an error of the same size that is
    no float32 rounding (a scale off by 1e-4) is not."""
    from grader.engine.reference import load_reference
    from grader.mistakes.lab7_relative_positions import rope
    lab = "lab7_relative_positions"
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64)
    positions = 100_000 + torch.randint(0, 50_000, (2, 1, 5), generator=g)
    tol = Tolerance(atol=1e-8, rtol=1e-8)

    def diagnosis(value):
        return diagnose(lab, "t", Mismatch("x"), [_recorded(lab, "apply_rope", x, positions,
                                                            value=value)], tol)

    assert diagnosis(rope(x, positions, angles_in="theta_float32")) == ROPE_FLOAT32
    assert diagnosis(rope(x, positions, angles_in="float32_cast")) == ROPE_FLOAT32
    right = load_reference(lab).apply_rope(x, positions)
    assert diagnosis(right * (1 + 1e-4)) == ""
    assert diagnosis(rope(x, positions + 1, angles_in="theta_float32")) == ""


def test_values_narrower_than_the_queries_is_named_only_for_their_crash():
    """A crash naming both widths on a call whose values are narrower is named; a crash of
    the same kind naming other sizes (a padding mask's), or one where v is as wide as q,
    is not."""
    from grader.engine.failures import StudentError
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 6, 8, generator=g), torch.randn(2, 9, 8, generator=g)

    def diagnosis(v, message):
        error = StudentError(kind="exception", type_name="RuntimeError", message=message)
        return diagnose(LAB6, "t", error, [_recorded(LAB6, "chunked_attention", q, k, v,
                                                     chunk_size=4, error=error)], TOL)

    narrow, wide = torch.randn(2, 9, 4, generator=g), torch.randn(2, 9, 8, generator=g)
    own = "The size of tensor a (8) must match the size of tensor b (4) at non-singleton dimension 2"
    assert diagnosis(narrow, own) == OUTPUT_LIKE_Q
    assert diagnosis(narrow, "The size of tensor a (9) must match the size of tensor b (6) at "
                             "non-singleton dimension 2") == ""
    assert diagnosis(wide, own) == ""
    assert diagnosis(narrow, "index 8 is out of bounds for dimension 2 with size 4") == ""


def test_window_below_one_is_named_only_where_the_contract_refuses():
    """A missing ValueError for window 0 or -2 is named; a missing ValueError on a window of
    3 (the contract accepts it), on another function, or a Mismatch, is not."""
    from grader.engine.failures import MissingRaise, StudentError
    q = torch.randn(1, 4, 8)
    crash = StudentError(kind="exception", type_name="ZeroDivisionError",
                         message="integer division or modulo by zero")
    missing = MissingRaise("expected a ValueError, but your code raised ZeroDivisionError")

    def diagnosis(window, exc=missing, target="sliding_window_attention", error=crash):
        return diagnose(LAB6, "t", exc, [_recorded(LAB6, target, q, q, q, window,
                                                   error=error)], TOL)

    assert diagnosis(0) == WINDOW_BELOW_ONE
    assert diagnosis(-2, error=None) == WINDOW_BELOW_ONE          # returned normally
    assert diagnosis(3) == ""
    assert diagnosis(0, exc=Mismatch("x")) == ""
    assert diagnosis(0, target="chunked_attention") == ""


def test_alibi_slopes_in_another_order_are_named_only_for_their_own_slopes():
    """Sorted steepest first, or started at 1: named; the same slopes one place off, or
    scaled by 1.01, are not."""
    from grader.mistakes.lab7_relative_positions import slopes
    tol = Tolerance(atol=1e-5, rtol=1e-4)

    def diagnosis(*values):
        return diagnose(LAB7, "t", Mismatch("x"), [
            _recorded(LAB7, "alibi_slopes", len(v), value=v) for v in values], tol)

    assert diagnosis(slopes(6, by_size=True), slopes(8)) == SLOPES_SORTED
    assert diagnosis(slopes(6, first_power=0), slopes(8, first_power=0)) == SLOPES_START_AT_ONE
    swapped = slopes(6, by_size=True)[[1, 0, 2, 3, 4, 5]]
    for near_miss in (swapped, slopes(6, by_size=True) * 1.01, slopes(6, first_power=0) * 1.01):
        assert diagnosis(near_miss) == ""
    assert diagnosis(slopes(8)) == ""                  # a power of two: sorted is right
