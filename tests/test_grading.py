"""End-to-end grading of fixture submissions named after their expected outcome.

Each fixture (tests/fixtures/submissions/<name>/expect.yaml) says which labs it breaks; the
whole report must agree: broken labs lose points, every other lab keeps full marks, and
nothing is reported as a grader error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import signal

import pytest
import torch

from helpers import expectation, fixture_names, grade, labs_changed, make_submission
from grader import paths
from grader.course import Course
from grader.engine.reference import load_reference
from grader.engine.student import Session, StudentLab
from grader.errors import EXIT_GRADER_FAULT, GraderFault, RubricError, SandboxError
from grader.grading import Grader
from grader.outputs.gradescope import write_gradescope
from grader.rubric import load_rubric
from grader.sandbox import Zygote, make_scratch, protocol, wire


def lab_scores(result) -> dict[str, tuple[float, float, str]]:
    return {lab.name: (lab.score, lab.max_score, lab.status) for lab in result.labs}


def assert_report(result, rubric, breaks: set[str], labs: list[str] | None = None) -> None:
    """The whole report on ``labs`` (default: all): every lab's status and score class, and
    no grader error."""
    assert result.status == "ok"
    assert [lab.name for lab in result.labs] == (list(rubric.labs) if labs is None else labs)
    for lab in result.labs:
        assert lab.max_score == rubric.labs[lab.name].max_points, lab.name
        assert len(lab.tests) == len(rubric.labs[lab.name].tests), lab.name
        for t in lab.tests:
            assert "grader error" not in t.message, (lab.name, t.name, t.message)
        if lab.name in breaks:
            assert lab.score < lab.max_score, f"{lab.name} should lose points"
        else:
            failing = {t.name: t.message for t in lab.tests if not t.passed}
            assert not failing, f"{lab.name} should keep full marks: {failing}"


def test_reference_solutions_score_full_marks(rubric, graded):
    result, _ = graded("solutions")
    assert_report(result, rubric, breaks=set())
    assert result.score == rubric.max_points


def test_untouched_stubs_score_zero_on_not_implemented(rubric, zygote):
    result = grade((paths.KIT / "exercises"), rubric=rubric, zygote=zygote)
    assert result.score == 0
    for lab in result.labs:
        assert lab.status == "graded"
        for t in lab.tests:
            assert not t.passed
            assert t.message.startswith("not implemented yet"), (t.name, t.message)



@pytest.mark.parametrize("name", fixture_names("ok_") + fixture_names("bug_"))
def test_fixture_loses_points_exactly_in_the_labs_it_breaks(name, rubric, graded):
    """Graded on the labs its files change (helpers.labs_changed): the others are the
    reference's files, which test_reference_solutions_score_full_marks grades."""
    expect = expectation(name)
    breaks = set(expect.get("breaks") or [])
    labs = labs_changed(name, rubric)
    assert breaks <= set(labs), f"{name} breaks labs whose files it does not change"
    result, _ = graded(name, labs)
    assert_report(result, rubric, breaks=breaks, labs=labs)


@pytest.mark.parametrize("name", fixture_names("broken_") + fixture_names("missing_"))
def test_broken_file_scores_zero_with_file_line_and_reason(name, rubric, zygote, tmp_path):
    expect = expectation(name)
    breaks = set(expect.get("breaks") or [])
    labs = labs_changed(name, rubric)
    assert breaks <= set(labs), f"{name} breaks labs whose files it does not change"
    result = grade(make_submission(name, tmp_path / name), rubric=rubric,
                   zygote=zygote, labs=labs)
    assert_report(result, rubric, breaks=breaks, labs=labs)
    direct = {f[:-3] for f in (expect.get("delete") or [])} | {
        p.stem for p in (paths.KIT / "tests" / "fixtures" / "submissions" / name).glob("*.py")}
    for lab in result.labs:
        if lab.name in direct:
            assert lab.score == 0
            assert lab.status in ("missing", "import_error"), lab.status
            assert lab.message, "a broken lab must say why"
            assert all(t.message == lab.message for t in lab.tests)


def test_syntax_error_names_file_line_and_reason(rubric, zygote, tmp_path):
    submission = make_submission("broken_syntax", tmp_path / "s")
    bad_line = _syntax_error_line((submission / "lab1_attention.py").read_text())
    first_three = ["lab1_attention", "lab2_multihead", "lab3_positional"]   # the ones asserted
    result = grade(submission, rubric=rubric, zygote=zygote, labs=first_three)
    lab1 = result.lab("lab1_attention")
    assert lab1.status == "import_error"
    assert f"lab1_attention.py:{bad_line}" in lab1.message
    assert "SyntaxError" in lab1.message
    # lab2 imports lab1: graded on its own (the reference answers its lab1 calls), it keeps
    # its points; graded cumulatively it cannot import either, and says where.
    assert result.lab("lab2_multihead").score == result.lab("lab2_multihead").max_score
    assert result.lab("lab3_positional").score == result.lab("lab3_positional").max_score
    both = grade(submission, rubric=dataclasses.replace(rubric, lab_imports="student"),
                 zygote=zygote, labs=first_three[:2])
    assert both.lab("lab2_multihead").status == "import_error"
    assert "lab1_attention.py" in both.lab("lab2_multihead").message


def _syntax_error_line(source: str) -> int:
    import ast
    try:
        ast.parse(source)
    except SyntaxError as exc:
        return exc.lineno
    raise AssertionError("the broken_syntax fixture parses")


def test_missing_file_reported_and_other_labs_graded(rubric, zygote, tmp_path):
    submission = tmp_path / "only_lab3"
    submission.mkdir()
    (submission / "lab3_positional.py").write_bytes(
        ((paths.KIT / "solutions") / "lab3_positional.py").read_bytes())
    result = grade(submission, rubric=rubric, zygote=zygote)
    for lab in result.labs:
        if lab.name == "lab3_positional":
            assert lab.score == lab.max_score
        else:
            assert (lab.status, lab.score) == ("missing", 0)
            assert lab.message == f"{lab.file} was not found in the submission"


def test_gradescope_results_json_shape(rubric, zygote, tmp_path):
    result = grade(make_submission("bug_softmax_dim", tmp_path / "s"),
                              rubric=rubric, zygote=zygote)
    write_gradescope(result, tmp_path / "out" / "results.json")
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["score"] == pytest.approx(result.score)
    assert len(data["tests"]) == sum(len(lab.tests) for lab in rubric.labs.values())
    for t in data["tests"]:
        assert set(t) >= {"name", "score", "max_score", "status", "visibility", "output", "tags"}
        assert t["status"] in ("passed", "failed")
        assert t["tags"][0] in rubric.labs
    labs = data["extra_data"]["labs"]
    assert set(labs) == set(rubric.labs)
    assert labs["lab1_attention"]["score"] < labs["lab1_attention"]["max_score"]
    assert labs["lab3_positional"]["score"] == labs["lab3_positional"]["max_score"]
    assert sum(v["score"] for v in labs.values()) == pytest.approx(data["score"])


def test_hidden_failures_show_no_values(rubric, zygote, tmp_path):
    """A hidden test's message keeps the cause but never the expected or received numbers."""
    result = grade(make_submission("bug_no_scale", tmp_path / "s"), rubric=rubric,
                   zygote=zygote, labs=labs_changed("bug_no_scale", rubric))
    hidden_failed = [t for lab in result.labs for t in lab.tests
                     if t.visibility == "hidden" and not t.passed]
    public_failed = [t for lab in result.labs for t in lab.tests
                     if t.visibility == "public" and not t.passed]
    assert hidden_failed and public_failed
    for t in hidden_failed:
        # Counts may appear ("3 of 40 elements"); values and positions may not.
        assert not re.search(r"worst at|index \(|expected -?\d|got -?\d|error \d", t.message), t.message
    assert any("worst at" in t.message for t in public_failed)


class DyingZygote:
    """A zygote of the test's own that dies (SIGKILL, by its pid) as the grader asks it for
    its ``die_at``-th worker: an infrastructure failure in the middle of a submission."""

    def __init__(self, zygote: Zygote, die_at: int):
        self.zygote, self.die_at, self.spawned = zygote, die_at, 0

    def spawn(self, **kwargs):
        self.spawned += 1
        if self.spawned == self.die_at:
            os.kill(self.zygote.pid, signal.SIGKILL)
            self.zygote._proc.wait()
        return self.zygote.spawn(**kwargs)

    def __getattr__(self, name):
        return getattr(self.zygote, name)


def test_a_sandbox_that_dies_mid_submission_is_a_grader_fault_not_a_score(rubric):
    # Its own zygote: this test kills it, and no other test may share a dead sandbox.
    with Zygote(forbidden=rubric.all_forbidden) as own:
        dying = DyingZygote(own, die_at=3)
        with Grader(Course(paths.KIT, rubric), zygote=dying) as grader:
            assert grader.alive
            with pytest.raises(SandboxError, match="failed during grading .its zygote stopped") \
                    as exc:
                grader.grade((paths.KIT / "solutions"))
            assert not grader.alive
    assert dying.spawned >= 3
    assert isinstance(exc.value, GraderFault) and exc.value.exit_code == EXIT_GRADER_FAULT


class RefusingZygote(DyingZygote):
    """A live zygote that cannot start one worker (a fault of the sandbox's own)."""

    def spawn(self, **kwargs):
        self.spawned += 1
        if self.spawned == self.die_at:
            raise SandboxError("could not start a worker: no reply")
        return self.zygote.spawn(**kwargs)


def test_a_worker_the_sandbox_cannot_start_is_a_grader_fault_not_a_score(rubric, zygote):
    refusing = RefusingZygote(zygote, die_at=2)
    with Grader(Course(paths.KIT, rubric), zygote=refusing) as grader, \
            pytest.raises(SandboxError, match="could not start a worker"):
        grader.grade((paths.KIT / "solutions"))
    assert refusing.alive


def test_a_submission_that_ends_its_own_worker_is_scored_as_its_own_fault(rubric, zygote,
                                                                           tmp_path):
    """The other side of the line: os._exit in student code is the student's doing."""
    sub = make_submission("ok_einsum", tmp_path / "sub")
    lab1 = sub / "lab1_attention.py"
    lab1.write_text(lab1.read_text() + "\n\nimport os as _os\n\n"
                    "def causal_mask(seq_q, seq_k=None, device=None):\n    _os._exit(3)\n")
    with Grader(Course(paths.KIT, rubric), zygote=zygote) as grader:
        result = grader.grade(sub, labs=["lab1_attention"])
        assert grader.alive
    lab = result.lab("lab1_attention")
    assert lab.status == "graded" and 0 < lab.score < lab.max_score
    crashed = [t for t in lab.tests if not t.passed]
    assert crashed and all("crashed the worker process" in t.message for t in crashed), \
        [t.message for t in crashed]


@pytest.mark.parametrize("name", ["bug_nan_blocked_rows", "bug_softmax_dim", "broken_syntax"])
def test_a_labs_points_depend_on_its_own_code_only(name, rubric, zygote, tmp_path):
    """lab2 imports lab1: while lab2 is graded the course's reference answers its calls of
    lab1 (gradients included), so a lab1 bug costs lab1's points and no lab2 point. With
    ``lab_imports: student`` (cumulative grading) the student's own lab1 is used."""
    submission = make_submission(name, tmp_path / name)
    asserted = ["lab1_attention", "lab2_multihead"]
    own = grade(submission, rubric=rubric, zygote=zygote, labs=asserted)
    assert own.lab("lab1_attention").score < own.lab("lab1_attention").max_score
    lab2 = own.lab("lab2_multihead")
    assert lab2.status == "graded" and lab2.score == lab2.max_score, \
        [(t.name, t.message) for t in lab2.tests if not t.passed]

    cumulative = dataclasses.replace(rubric, lab_imports="student")
    both = grade(submission, rubric=cumulative, zygote=zygote, labs=asserted)
    assert both.lab("lab2_multihead").score < lab2.max_score


def test_lab_imports_is_validated_with_file_and_line(tmp_path):
    path = tmp_path / "rubric.yaml"
    text = (paths.KIT / "rubric.yaml").read_text()
    line = text[: text.index("\nversion: 1\n")].count("\n") + 3
    path.write_text(text.replace("\nversion: 1\n", "\nversion: 1\nlab_imports: mine\n", 1))
    with pytest.raises(RubricError) as exc:
        load_rubric(path)
    assert exc.value.errors == [f"{path}:{line}: lab_imports: expected one of reference, "
                                "student, got the string 'mine'"]
    path.write_text(text.replace("\nversion: 1\n", "\nversion: 1\nlab_imports: student\n", 1))
    assert load_rubric(path).lab_imports == "student"
    assert load_rubric((paths.KIT / "rubric.yaml")).lab_imports == "reference"


def test_a_lab_may_call_only_what_the_other_lab_provides(rubric, zygote, tmp_path):
    """The stub module holds the earlier lab's contract functions only, and the trusted
    side refuses a forged call of anything else; what it allows, a reference worker
    answers."""
    submission = make_submission("ok_einsum", tmp_path / "sub")
    lab2 = submission / "lab2_multihead.py"
    lab2.write_text(lab2.read_text() + (
        "\n\nimport lab1_attention as _l1\n\n"
        "def _probe_names():\n"
        "    return sorted(n for n in dir(_l1) if not n.startswith('_'))\n"))
    with Grader(Course(paths.KIT, rubric), zygote=zygote) as grader:
        result = grader.grade(submission, labs=["lab2_multihead"])
        importable = grader._importable
    assert result.lab("lab2_multihead").score == result.lab("lab2_multihead").max_score
    scratch = make_scratch({f.name: f.read_bytes() for f in submission.glob("lab*.py")})
    reference = make_scratch({f.name: f.read_bytes() for f in (paths.KIT / "solutions").glob("lab*.py")})
    real = Session(zygote=zygote, submission_dir=scratch.name, forbidden={},
                   importable=importable, reference_dir=reference.name)
    try:
        real.start_test(10, test="t", lab="lab2_multihead")
        # What the worker's lab1_attention holds: the contract's names, no student code.
        assert StudentLab(real, "lab2_multihead").call("_probe_names") == \
            sorted(rubric.labs["lab1_attention"].exports)
    finally:
        real.close()
        scratch.cleanup()
    session = Session(zygote=zygote, submission_dir=str(submission), forbidden={},
                      importable={"lab2_multihead": {"lab1_attention": ("causal_mask",)}},
                      reference_dir=reference.name)
    try:
        session.start_test(10, test="t", lab="lab2_multihead")
        with pytest.raises(ValueError, match="is not importable"):
            session._callback("lab2_multihead", protocol.callback_request(
                "lab1_attention", "scaled_dot_product_attention", [], {}, 0))
        with pytest.raises(ValueError, match="is not importable"):
            session._callback("lab1_attention", protocol.callback_request(
                "lab1_attention", "causal_mask", [3], {}, 0))
        assert torch.equal(session._callback("lab2_multihead", protocol.callback_request(
            "lab1_attention", "causal_mask", [3], {}, 0)),
            load_reference("lab1_attention").causal_mask(3))
    finally:
        session.close()
        reference.cleanup()


@pytest.mark.parametrize("err", [{"mro": 5}, {"mro": [1, None]}, {"type": ["x"] * 3},
                                 {"message": {"a": 1}, "where": 7}, {}])
def test_a_worker_error_reply_of_any_shape_reads_as_the_students_exception(err):
    """Student code can write to the worker's channel: an error reply's fields are read as
    capped text of the expected types, whatever came."""
    from grader.engine.student import _error_from_reply

    got = _error_from_reply(err, "lab1_attention", "")
    assert got.kind == "exception" and isinstance(got.type_name, str) and got.type_name
    assert got.describe(hidden=True) in ("your code raised Exception",
                                         "your code raised an exception")


def _first_calls(grader, labs) -> dict[str, dict]:
    """Each test's first request on ``labs``, decoded (the reference solutions graded
    once)."""
    plan = grader.call_plan(labs)
    return {test: wire.decode_frame(call.frame) for test, call in plan.first.items()}


def test_hidden_inputs_are_the_courses_own_and_public_inputs_fixed(rubric, zygote):
    a, b = b"a" * 32, b"b" * 32
    with Grader(Course(paths.KIT, rubric), zygote=zygote, send_ahead=True, secret=a) as ga, \
            Grader(Course(paths.KIT, rubric), zygote=zygote, send_ahead=True, secret=a) as ga2, \
            Grader(Course(paths.KIT, rubric), zygote=zygote, send_ahead=True, secret=b) as gb:
        # Lab 8's first requests are trainings, whose start the course draws too
        # (tests/test_lab8.py): three of them would be ~45 CPU s for no input to compare.
        labs = [lab for lab in rubric.labs if lab != "lab8_train_transformer"]
        first_a, first_a2, first_b = (_first_calls(g, labs) for g in (ga, ga2, gb))
    # A student's own check (public tests, not graded): the kit's fixed inputs, whatever
    # the secret.
    with Grader(Course(paths.KIT, rubric), zygote=zygote, send_ahead=True, secret=a,
                visibility=("public",)) as ca, \
            Grader(Course(paths.KIT, rubric), zygote=zygote, send_ahead=True, secret=b,
                   visibility=("public",)) as cb:
        check_a, check_b = _first_calls(ca, labs), _first_calls(cb, labs)
    assert set(first_a) == set(first_b)
    same = {t: wire.encode(first_a[t]) == wire.encode(first_b[t]) for t in first_a}
    hidden = [t for t in first_a if t.startswith("hidden/")]
    # A graded run's public inputs are its own (#44): never planned ahead.
    assert hidden and not any(t.startswith("public/") for t in first_a)
    assert check_a and set(check_a) == set(check_b)
    assert all(wire.encode(check_a[t]) == wire.encode(check_b[t]) for t in check_a)
    drawn = [t for t in hidden if any(isinstance(x, torch.Tensor) and x.is_floating_point()
                                      for x in first_a[t].get("args", []))]
    assert drawn and not any(same[t] for t in drawn)   # another course: other inputs
    assert all(wire.encode(first_a[t]) == wire.encode(first_a2[t]) for t in first_a)


LOOKUP_LAB1 = """
import hashlib
import torch

TABLE = {table!r}


def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0, training=False):
    # No attention at all: outputs looked up by the inputs' bytes (a leaked table).
    key = hashlib.sha256(q.detach().contiguous().numpy().tobytes()).hexdigest()
    if key in TABLE:
        out, w = TABLE[key]
        return torch.tensor(out, dtype=q.dtype), torch.tensor(w, dtype=q.dtype)
    return torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype), \\
        torch.zeros(*q.shape[:-1], k.shape[-2], dtype=q.dtype)


def causal_mask(seq_q, seq_k=None, device=None):
    seq_k = seq_q if seq_k is None else seq_k
    return torch.zeros(seq_q, seq_k, dtype=torch.bool)
"""


def test_a_lookup_table_leaked_from_another_course_scores_no_hidden_point(rubric, zygote,
                                                                         tmp_path):
    """A table of hidden inputs -> outputs, as a leak through feedback or a past term would
    give it, scores hidden points in its own course (the control) and none in another."""
    leaked, other = b"L" * 32, b"O" * 32
    reference = load_reference("lab1_attention")
    with Grader(Course(paths.KIT, rubric), zygote=zygote, send_ahead=True, secret=leaked) as grader:
        table = {}
        for test, req in _first_calls(grader, ["lab1_attention"]).items():
            if test.startswith("hidden/test_lab1") and \
                    req.get("target") == "scaled_dot_product_attention":
                q, k, v = req["args"][:3]
                out, w = reference.scaled_dot_product_attention(q, k, v, **req["kwargs"])
                key = hashlib.sha256(q.contiguous().numpy().tobytes()).hexdigest()
                table[key] = (out.tolist(), w.tolist())
    assert table
    sub = tmp_path / "lookup"
    sub.mkdir()
    (sub / "lab1_attention.py").write_text(LOOKUP_LAB1.format(table=table))

    def hidden_points(secret):
        with Grader(Course(paths.KIT, rubric), zygote=zygote, secret=secret) as grader:
            lab = grader.grade(sub, labs=["lab1_attention"]).lab("lab1_attention")
        return sum(t.score for t in lab.tests if t.visibility == "hidden")

    assert hidden_points(leaked) > 0            # the table works where it was made
    assert hidden_points(other) == 0            # and nowhere else


# --------------------------------------------------------------------------------------------
# a one-off grading starts fast: the zygote loads while this process imports torch
# --------------------------------------------------------------------------------------------

def test_the_command_line_and_the_grader_import_no_torch_before_a_zygote_is_launched():
    """``grader check`` launches its zygote and then imports torch while the zygote imports
    its own: importing the CLI, ``grader.grading`` and ``grader.sandbox`` must not."""
    import subprocess
    import sys
    code = ("import gc, sys, grader.cli, grader.grading, grader.sandbox\n"
            "grader.cli.build_parser()\n"
            "print(sorted(m for m in ('torch', 'pytest', 'numpy') if m in sys.modules))\n"
            "grader.grading.load_engine()\n"
            "print(all(m in sys.modules for m in ('torch', 'pytest',\n"
            "                                     *grader.grading.ENGINE_MODULES)))\n"
            "print(gc.isenabled(), gc.get_freeze_count() > 100_000)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    # Nothing heavy before the engine is asked for; then all of it, the collector back on
    # and the loaded heap frozen (the batch's forkserver preloads the same modules).
    assert out.stdout.split("\n")[:3] == ["[]", "True", "True True"], out.stdout + out.stderr


def test_a_grader_launches_its_zygote_then_loads_the_engine_then_waits(rubric, monkeypatch):
    import grader.grading as grading
    order = []

    class Recording(Zygote):
        def launch(self):
            if self._probe_dir is None and not self.alive:    # a launch, not a no-op
                order.append("launch")
            return super().launch()

        def start(self):
            order.append("wait" if self._probe_dir is not None else "start")
            return super().start()

    real_load, real_runner = grading.load_engine, Grader._runner
    # The jail's zygote, as the backends give it (grader.sandbox.backends.new_zygote).
    monkeypatch.setattr("grader.sandbox.host.Zygote", Recording)
    monkeypatch.setattr(grading, "load_engine", lambda: (order.append("engine"), real_load()))
    monkeypatch.setattr(Grader, "_runner",
                        lambda self, v: (order.append(f"suites {v}"), real_runner(self, v))[1])
    grader = Grader(Course(paths.KIT, rubric), visibility=("public",))
    try:
        grader.start(suites=True)
        assert order == ["launch", "engine", "suites ('public',)", "wait"]
        assert grader.alive and grader.sandbox_pid and grader._zygote.warm_up == "ok"
        result = grader.grade((paths.KIT / "solutions"), labs=["lab1_attention"])
    finally:
        grader.close()
    public = [t.points for t in rubric.labs["lab1_attention"].tests.values()
              if t.visibility == "public"]
    assert result.score == sum(public) > 0 and result.status == "ok"
    assert not grader.alive
