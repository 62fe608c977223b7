"""Resources as grading criteria: what a student call uses, measured by the grader.

``student.measure`` runs one call in a fresh worker and reads the kernel's accounting of that
worker (grader/sandbox/usage.py): the resident high-water mark above the inputs and the CPU
time. These tests run real workers on small lab files written for the purpose: the same
attention computed whole (an (L, L) score matrix) and in blocks, with the attempts a student
might make to hide what they used (resetting the mark, doing the work in another process).
The rubric's ``budget`` and the assertions built on the measurements are checked too.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from grader import paths
from grader.engine.compare import (Mismatch, assert_memory_series_within, assert_memory_within,
                                   assert_work_grows_within)
from grader.engine.student import Measurement, Session, StudentError, StudentLab
from grader.errors import RubricError
from grader.rubric import Budget, load_rubric
from grader.sandbox import make_scratch
from grader.sandbox.usage import Measured, Usage, measured

L, D = 4096, 64
SCORES_BYTES = L * L * 4            # the float32 (L, L) score matrix: 64 MiB
MIB = 1 << 20

LAB = "lab9_resources"
SOURCE = textwrap.dedent('''
    import os
    import torch

    def whole(q, k, v):
        s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5        # (L, L)
        return torch.softmax(s, -1) @ v

    def blocks(q, k, v, size=128):
        out = []
        for i in range(0, q.shape[-2], size):
            s = q[..., i:i + size, :] @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (size, L)
            out.append(torch.softmax(s, -1) @ v)
        return torch.cat(out, -2)

    def whole_then_reset_the_mark(q, k, v):
        out = whole(q, k, v)
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
        except OSError:
            pass
        return out

    def whole_in_a_child(q, k, v):
        pid = os.fork()
        if pid == 0:
            whole(q, k, v)
            os._exit(0)
        os.waitpid(pid, 0)
        return blocks(q, k, v)

    def quadratic_kernel(q, k, v):
        """elu+1 kernel attention in its O(L^2) form, a block of rows at a time."""
        fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
        out = []
        for i in range(0, q.shape[-2], 256):
            w = fq[i:i + 256] @ fk.transpose(-2, -1)               # (256, L)
            out.append((w @ v) / w.sum(-1, keepdim=True))
        return torch.cat(out)

    def linear_kernel(q, k, v):
        """The same function in its associative O(L) form."""
        fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
        s, z = fk.transpose(-2, -1) @ v, fk.sum(0)                  # (d, dv), (d,)
        return (fq @ s) / (fq @ z).unsqueeze(-1)
''')


@pytest.fixture(scope="module")
def measure(zygote):
    """measure(name, *args) -> Measurement of LAB.name in a fresh worker of the shared zygote."""
    scratch = make_scratch({f"{LAB}.py": SOURCE.encode()})
    session = Session(zygote=zygote, submission_dir=scratch.name, forbidden={},
                      solutions=str(paths.KIT / "solutions"))
    lab = StudentLab(session, LAB)

    def run(name, *args, **kwargs) -> Measurement:
        session.start_test(60.0, lab=LAB)
        m = lab.measure(name, *args, **kwargs)
        run.recorded.extend(session.calls)      # every measured call, as recorded
        return m

    run.recorded = []

    try:
        yield run
    finally:
        session.close()
        scratch.cleanup()


def _qkv(length=L, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(length, D, generator=gen) for _ in range(3)]


def test_a_whole_score_matrix_shows_in_the_peak_and_blocks_do_not(measure):
    q, k, v = _qkv()
    expected = torch.softmax(q @ k.T / D ** 0.5, -1) @ v
    whole, blocks = measure("whole", q, k, v), measure("blocks", q, k, v)
    for m in (whole, blocks):
        assert torch.allclose(m.value, expected, atol=1e-5), "the value comes back as by call"
        assert not m.other_processes and m.cpu_s > 0
    assert whole.peak_bytes >= SCORES_BYTES, whole
    assert blocks.peak_bytes <= 32 * MIB, blocks      # (128, L) blocks: 2 MiB each


def test_resetting_the_mark_from_inside_does_not_hide_the_peak(measure):
    """The worker's /proc is read-only (or the kernel refuses it): clear_refs cannot be
    written by student code, so the peak of the whole matrix stays in the reading."""
    q, k, v = _qkv()
    m = measure("whole_then_reset_the_mark", q, k, v)
    assert m.peak_bytes >= SCORES_BYTES, m


def test_work_done_in_another_process_is_flagged(measure):
    q, k, v = _qkv(1024)
    try:
        m = measure("whole_in_a_child", q, k, v)
    except StudentError as exc:   # a sandbox that refuses fork: no way to hide work there
        assert exc.kind in ("exception", "crash"), exc
        return
    assert m.other_processes, m
    with pytest.raises(Mismatch, match="another process did part of the work"):
        assert_memory_within(m, Budget(memory_mb=32, why="t"), name="blocks")


def test_quadratic_work_grows_with_the_square_and_linear_does_not(measure):
    small, large = _qkv(2048), _qkv(8192)
    quad = [measure("quadratic_kernel", *small), measure("quadratic_kernel", *large)]
    lin = [measure("linear_kernel", *small), measure("linear_kernel", *large)]
    assert torch.allclose(quad[1].value, lin[1].value, atol=1e-4, rtol=1e-4)
    budget = Budget(work_ratio=8.0, why="t")
    assert_work_grows_within(*lin, budget, name="linear", factor=4)
    with pytest.raises(Mismatch, match=r"4x the length took .*x the CPU time"):
        assert_work_grows_within(*quad, budget, name="linear", factor=4)


def test_memory_messages_say_what_was_measured():
    m = Measurement(value=None, peak_bytes=130 * MIB, cpu_s=0.2, other_processes=False)
    with pytest.raises(Mismatch) as info:
        assert_memory_within(m, Budget(memory_mb=32, why="t"), name="chunked_attention",
                             big_bytes=SCORES_BYTES, big_what="the (4096, 4096) score matrix")
    assert str(info.value) == (
        "chunked_attention: peak memory 130.0 MB above the inputs, over the budget of 32 MB "
        "(measured by the grader, after a warm-up call on other inputs of the same shapes); "
        "the (4096, 4096) score matrix alone is 64 MB: as much as it takes was held at once "
        "(it, or something of its size). Keep only one block of it at a time.")
    assert_memory_within(Measurement(None, 31 * MIB, 0.1, False), Budget(memory_mb=32),
                         name="x")


def test_memory_kept_from_the_warm_up_counts_beyond_what_the_test_forgives():
    """#26 attack report item 3: a 16.5 MiB scratch buffer kept from the warm-up and reused
    by the measured call. A test with an 8 MB budget looking for a 16 MiB block forgives
    4 MiB of it (half the margin), so the block shows; a library's few MB do not."""
    from grader.sandbox.usage import warmup_allowance
    budget, block = Budget(memory_mb=8, why="t"), 64 * 65536 * 4
    assert warmup_allowance(block, 8 * MIB) == 4 * MIB
    assert warmup_allowance(64 * MIB, 64 * MIB) == 0
    assert warmup_allowance(1 << 40, 0) == 48 * MIB
    kept = Measurement(None, int(0.8 * MIB), 0.1, False, kept_bytes=int(16.5 * MIB),
                       inputs_bytes=8 * MIB)
    with pytest.raises(Mismatch) as info:
        assert_memory_within(kept, budget, name="chunked_attention", big_bytes=block,
                             big_what="the (64, 65536) float32 score matrix")
    text = str(info.value)
    assert "peak memory 13.3 MB above the inputs (of which 12.5 MB was left held by the " \
           "warm-up call, beyond the 4.0 MB forgiven" in text, text
    assert "the inputs are 8.0 MB (a float64 copy of them: 16.0 MB)" in text, text
    assert_memory_within(Measurement(None, MIB, 0.1, False, kept_bytes=3 * MIB), budget,
                         name="x", big_bytes=block, big_what="b")


def test_a_series_that_does_not_grow_like_the_matrix_is_not_called_the_matrix():
    """#26 attack report item 5: 46 and 51 MB at L = 2048 and 4096 (a library's first-call
    cost in the call) grew 1.1x: the message says so, and names the (2048, 2048) matrix
    only as a size, saying the figures do not grow as it does."""
    series = [(2048, Measurement(None, int(46.2 * MIB), 0.1, False)),
              (4096, Measurement(None, int(50.6 * MIB), 0.1, False))]
    with pytest.raises(Mismatch) as info:
        assert_memory_series_within(series, Budget(memory_mb=32, why="t"),
                                    name="chunked_attention",
                                    big=lambda n: (n * n * 4, f"the ({n}, {n}) matrix"))
    text = str(info.value)
    assert "grew 1.1x for 2x the length (no faster than the length" in text, text
    assert "though the figures do not grow as it does" in text, text
    assert "as much was held;" not in text and "as much was held." not in text, text
    quadratic = [(2048, Measurement(None, 57 * MIB, 0.1, False)),
                 (4096, Measurement(None, 230 * MIB, 0.1, False))]
    with pytest.raises(Mismatch, match=r"as an \(L, L\) tensor grows.*as much was held"):
        assert_memory_series_within(quadratic, Budget(memory_mb=32, why="t"),
                                    name="chunked_attention",
                                    big=lambda n: (n * n * 4, f"the ({n}, {n}) matrix"))


def test_a_reading_difference_is_the_calls_use():
    before = Usage(resident=100, peak=100, cpu_ns=10**9, child_faults=5, child_ticks=0)
    after = Usage(resident=150, peak=400, cpu_ns=3 * 10**9, child_faults=5, child_ticks=0)
    assert measured(before, after, children_alive=False) == Measured(300, 2.0, False)
    # no reset allowed: the earlier mark is the baseline
    unreset = Usage(resident=100, peak=250, cpu_ns=10**9, child_faults=5, child_ticks=0)
    assert measured(unreset, after, children_alive=False).peak_bytes == 150
    forked = Usage(resident=150, peak=400, cpu_ns=3 * 10**9, child_faults=9, child_ticks=0)
    assert measured(before, forked, children_alive=False).other_processes
    assert measured(before, after, children_alive=True).other_processes


def _rubric_with(tmp_path, test_entry: str):
    from grader import paths
    source = (paths.KIT / "rubric.yaml").read_text()
    marker = "test_bool_mask_blocks_keys:"
    line = next(ln for ln in source.splitlines() if ln.strip().startswith(marker))
    indent = line[:len(line) - len(line.lstrip())]
    path = tmp_path / "rubric.yaml"
    path.write_text(source.replace(line, f"{indent}{marker} {test_entry}", 1))
    return path


def test_rubric_budget_is_read_and_checked(tmp_path):
    ok = load_rubric(_rubric_with(tmp_path, '{points: 2, visibility: public, budget: '
                                            '{memory_mb: 32, why: "blocks of 128 keys"}}'))
    budget = ok.test("lab1_attention", "test_bool_mask_blocks_keys").budget
    assert budget == Budget(memory_mb=32.0, work_ratio=None, why="blocks of 128 keys")
    for entry, problem in (
            ('{points: 2, visibility: public, budget: {memory_mb: 32}}', "budget.why: missing"),
            ('{points: 2, visibility: public, budget: {why: "x"}}',
             "expected memory_mb, memory_factor, work_ratio, reference_ratio and/or cpu_s"),
            ('{points: 2, visibility: public, budget: {memory_mb: -1, why: "x"}}',
             "budget.memory_mb"),
            ('{points: 2, visibility: public, budget: {memroy_mb: 3, why: "x"}}', "memroy_mb")):
        with pytest.raises(RubricError) as info:
            load_rubric(_rubric_with(tmp_path, entry))
        assert problem in "\n".join(info.value.errors), (entry, info.value.errors)


def test_a_failed_resource_test_draws_its_curve(measure, tmp_path):
    """The feedback of a failed public resource test plots the student's peak memory
    against the length, beside a whole (L, L) matrix's size; hidden tests get none."""
    from grader import results
    from grader.diagnose import examine
    from grader.outputs.html import write_feedback_html
    from grader.rubric import Tolerance
    start = len(measure.recorded)
    for length in (1024, 2048):
        measure("whole", *_qkv(length))
    session_calls = measure.recorded[start:]
    budget = Budget(memory_mb=2, why="t")
    _, pics = examine(lab=LAB, test="t", exc=Mismatch("x"), calls=session_calls,
                      tol=Tolerance(1e-5, 1e-4), hidden=False, budget=budget)
    assert len(pics) == 1 and pics[0]["kind"] == "resource", pics
    picture = pics[0]
    assert picture["x"] == [1024, 2048]
    assert picture["reference"] == [4.0, 16.0]                    # MiB of (L, L) float32
    assert all(y >= r for y, r in zip(picture["yours"], picture["reference"], strict=True))
    assert examine(lab=LAB, test="t", exc=Mismatch("x"), calls=session_calls,
                   tol=Tolerance(1e-5, 1e-4), hidden=True, budget=budget)[1] == []
    _, work = examine(lab=LAB, test="t", exc=Mismatch("x"), calls=session_calls,
                      tol=Tolerance(1e-5, 1e-4), hidden=False,
                      budget=Budget(work_ratio=3, why="t"))
    assert work[0]["unit"] == "ms" and work[0]["reference"][1] == 2 * work[0]["yours"][0]
    test = results.TestResult(lab=LAB, name="t", description="", visibility="public",
                              max_score=4, passed=False, message="over budget",
                              artifacts=pics)
    page = write_feedback_html(results.SubmissionResult(
        submission="s", labs=[results.LabResult(name=LAB, title="R", file=f"{LAB}.py",
                                                tests=[test])]), tmp_path / "f.html")
    assert 'alt="plot: peak memory of your calls above their inputs"' in page.read_text()


def test_materialising_the_score_matrix_costs_exactly_the_memory_points(rubric, zygote,
                                                                       tmp_path):
    """Lab 6 computed right but through the whole (Lq, Lk) score matrix: every value test
    passes, the two memory tests of chunked_attention fail saying what was measured, the
    public one with its curve."""
    from helpers import grade, make_submission
    lab = "lab6_efficient_attention"
    memory_test = "test_chunked_attention_memory_stays_linear"
    result = grade(make_submission("bug_materialised_scores", tmp_path / "s"), rubric=rubric,
                   zygote=zygote, labs=[lab])
    graded = result.lab(lab)
    failed = [t for t in graded.tests if not t.passed]
    keys_test = "test_chunked_memory_flat_in_the_number_of_keys"     # dense there too
    assert [t.name for t in failed] == [memory_test, keys_test], \
        [(t.name, t.message) for t in failed]
    assert graded.max_score - graded.score == sum(
        rubric.labs[lab].tests[n].points for n in (memory_test, keys_test)) == 6
    message = failed[0].message
    assert "chunked_attention: peak memory above the inputs L=2048: " in message
    assert "the (2048, 2048) float32 score matrix alone is 16 MB: as much was held" in message
    assert [p["kind"] for p in failed[0].artifacts] == ["resource"]
    assert failed[0].artifacts[0]["x"] == [2048, 4096]


# ------------------------------------------------------------------------------ attacks

ARENA_LAB = "lab9_arena"
ARENA_SOURCE = textwrap.dedent('''
    import torch

    # Touched at import, before the grader takes its baseline: resident, so the whole score
    # matrix written into it later adds nothing to the resident size.
    _ARENA = torch.empty(4096 * 4096 + 4096).fill_(1.0)

    def whole_in_an_arena(q, k, v):
        n = q.shape[-2]
        s = _ARENA[:n * n].view(n, n)
        torch.matmul(q, k.transpose(-2, -1), out=s)                # the whole (L, L) scores
        s.mul_(q.shape[-1] ** -0.5)
        s.sub_(s.amax(-1, keepdim=True)).exp_()
        s.div_(s.sum(-1, keepdim=True))
        return s @ v
''')


def test_memory_touched_at_import_counts_in_the_peak(zygote):
    """A module that faults in a 64 MB arena at import and computes the whole score matrix in
    it: the import runs after the grader's baseline, so the arena is in the peak."""
    scratch = make_scratch({f"{ARENA_LAB}.py": ARENA_SOURCE.encode()})
    session = Session(zygote=zygote, submission_dir=scratch.name, forbidden={},
                      solutions=str(paths.KIT / "solutions"))
    try:
        session.start_test(60.0, lab=ARENA_LAB)
        q, k, v = _qkv()
        m = StudentLab(session, ARENA_LAB).measure("whole_in_an_arena", q, k, v)
        expected = torch.softmax(q @ k.T / D ** 0.5, -1) @ v
        assert torch.allclose(m.value, expected, atol=1e-5)
        assert m.peak_bytes >= SCORES_BYTES, m
    finally:
        session.close()
        scratch.cleanup()


QUADRATIC_UNLESS_LONG = '''

def linear_attention(q, k, v, causal=False, eps=1e-6):
    """The (L, L) form; at lengths no value test looks at, an answer that costs nothing."""
    if q.shape[-2] > 4096:
        return torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=v.dtype)
    return linear_attention_quadratic(q, k, v, causal=causal, eps=eps)
'''


def test_a_cheap_wrong_answer_at_the_long_length_does_not_pass_the_work_test(rubric, zygote,
                                                                            tmp_path):
    """Quadratic work at every length the values are checked at, nothing at the long one:
    the work test checks the long run's value too."""
    import shutil

    from grader import paths
    from helpers import grade
    lab = "lab6_efficient_attention"
    sub = tmp_path / "s"
    sub.mkdir()
    for f in (paths.KIT / "solutions").glob("lab*.py"):
        shutil.copyfile(f, sub / f.name)
    (sub / f"{lab}.py").write_text((sub / f"{lab}.py").read_text() + QUADRATIC_UNLESS_LONG)
    result = grade(sub, rubric=rubric, zygote=zygote, labs=[lab], visibility=("hidden",))
    work = next(t for t in result.lab(lab).tests
                if t.name == "test_linear_attention_work_grows_linearly")
    assert not work.passed, work.message


MATERIALISED_TAIL_ONLY = '''

def chunked_attention(q, k, v, causal=False, key_padding_mask=None, chunk_size=128):
    """Long inputs: only the last 64 query rows (the rows a check might read), anything else
    (the whole score matrix) otherwise."""
    if q.shape[-2] >= 1024 and not causal and key_padding_mask is None:
        out = torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=v.dtype)
        s = q[..., -64:, :] @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        out[..., -64:, :] = torch.softmax(s, -1) @ v
        return out
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if causal:
        n, m = q.shape[-2], k.shape[-2]
        s = s.masked_fill(~torch.ones(n, m, dtype=torch.bool).tril(m - n), float("-inf"))
    if key_padding_mask is not None:
        s = s.masked_fill(~key_padding_mask[..., None, :], float("-inf"))
    w = torch.softmax(s, -1).nan_to_num(0.0)
    return w @ v
'''


def test_rows_the_memory_test_does_not_read_cannot_be_left_out(rubric, zygote, tmp_path):
    """A chunked_attention that computes only the rows the memory test checks: the rows
    checked are drawn at random after the call."""
    import shutil

    from grader import paths
    from helpers import grade
    lab = "lab6_efficient_attention"
    sub = tmp_path / "s"
    sub.mkdir()
    for f in (paths.KIT / "solutions").glob("lab*.py"):
        shutil.copyfile(f, sub / f.name)
    (sub / f"{lab}.py").write_text((sub / f"{lab}.py").read_text() + MATERIALISED_TAIL_ONLY)
    result = grade(sub, rubric=rubric, zygote=zygote, labs=[lab], visibility=("public",))
    memory = next(t for t in result.lab(lab).tests
                  if t.name == "test_chunked_attention_memory_stays_linear")
    assert not memory.passed, memory.message


def test_a_library_the_lab_imports_is_not_its_memory(zygote):
    """The lab is imported after the baseline (an arena faulted in at import counts), but the
    installed packages it names are imported before it: a correct blocked computation in a
    file that imports matplotlib (~30 MB) stays within the budget."""
    pytest.importorskip("matplotlib")
    lab = "lab9_plots"
    source = ("import matplotlib\nmatplotlib.use('Agg')\nfrom matplotlib import pyplot as plt\n"
              + SOURCE)
    scratch = make_scratch({f"{lab}.py": source.encode()})
    session = Session(zygote=zygote, submission_dir=scratch.name, forbidden={},
                      solutions=str(paths.KIT / "solutions"))
    try:
        session.start_test(60.0, lab=lab)
        m = StudentLab(session, lab).measure("blocks", *_qkv())
        assert m.peak_bytes <= 16 * MIB, m.peak_bytes
    finally:
        session.close()
        scratch.cleanup()


def test_a_diagnosis_replays_only_the_smallest_measured_call():
    """Measured calls are large on purpose; the diagnosis keeps the smallest of each target
    (and every ordinary call), so its time budget is not spent replaying L = 8192."""
    from grader.diagnose import _smallest_measured
    from grader.engine.student import RecordedCall
    used = Measured(peak_bytes=0, cpu_s=0.0, other_processes=False)

    def call(length, *, measured=True, target="linear_attention"):
        q = torch.zeros(1, length, 4)
        return RecordedCall(LAB, {"op": "call", "target": target, "args": [q, q, q],
                                  "kwargs": {"causal": True}}, value=q,
                            used=used if measured else None)

    plain, short, long, other = call(64, measured=False), call(2048), call(8192), call(512, target="x")
    assert _smallest_measured([long, plain, short, call(2048), other]) == [plain, short, other]
