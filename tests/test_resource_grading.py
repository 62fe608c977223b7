"""Resource grading that the student's code cannot move (issue #26).

Each case is a fixture submission (tests/fixtures/submissions/) graded as ``grader grade``
grades it; the assertions are on the lab report: which tests fail, and what their
messages say was measured.
"""

from __future__ import annotations

import pytest

from helpers import grade, make_submission
from grader import paths

LAB5, LAB6 = "lab5_decoder", "lab6_efficient_attention"
CHUNKED_MEMORY = "test_chunked_attention_memory_stays_linear"


@pytest.fixture(scope="module")
def report(rubric, zygote, tmp_path_factory):
    """report(fixture, lab, visibility) -> {test name: (passed, message)}, graded once."""
    done = {}

    def run(name: str, lab: str, visibility=("public", "hidden")) -> dict:
        key = (name, lab, tuple(visibility))
        if key not in done:
            sub = make_submission(name, tmp_path_factory.mktemp(name))
            result = grade(sub, rubric=rubric, zygote=zygote, labs=[lab],
                           visibility=tuple(visibility))
            done[key] = {t.name: (t.passed, t.message) for t in result.lab(lab).tests}
        return done[key]

    return run


def failed(tests: dict) -> dict:
    return {name: msg for name, (ok, msg) in tests.items() if not ok}


def test_library_pages_dropped_by_madvise_do_not_lower_the_memory_figure(report):
    """Item 1: the whole score matrix, built after madvise(MADV_DONTNEED) of every library's
    code pages: the memory test fails all the same."""
    bad = failed(report("atk_madvise_below_baseline", LAB6, ("public",)))
    assert set(bad) == {CHUNKED_MEMORY}, bad
    assert "(2048, 2048) float32 score matrix alone is 16 MB" in bad[CHUNKED_MEMORY]


def test_without_a_cgroup_the_fallback_still_sees_a_whole_matrix(rubric, zygote, tmp_path,
                                                                 monkeypatch):
    """ATTENTION_GRADER_MEMCG=off (a platform without a writable memory controller): the
    resident high-water mark measures the call, and the whole score matrix still fails."""
    from grader.sandbox import memcg
    monkeypatch.setenv(memcg.ENV_SWITCH, "off")
    assert memcg.group() is None
    sub = make_submission("bug_materialised_scores", tmp_path / "s")
    result = grade(sub, rubric=rubric, zygote=zygote, labs=[LAB6], visibility=("public",))
    bad = failed({t.name: (t.passed, t.message) for t in result.lab(LAB6).tests})
    assert set(bad) == {CHUNKED_MEMORY}, bad
    assert "as much was held" in bad[CHUNKED_MEMORY]


def test_a_librarys_first_call_cost_is_not_the_students(report):
    """Item 8: torch.broadcast_shapes' first call imports sympy (+35 MB); the warm-up call
    before the measured one pays it, and the correct blocked lab keeps full marks."""
    assert failed(report("ok_lab6_broadcast_shapes", LAB6)) == {}


@pytest.mark.parametrize("name, lab", [
    ("bug_online_softmax_missing", LAB6),             # item 2
    ("bug_dense_below_threshold", LAB6),              # item 3
    ("bug_running_max_zero_init", LAB6),              # item 4
    ("atk_burn_short_length", LAB6),                  # item 5
    ("bug_generate_recomputes_prefix", LAB5),         # item 6
    ("atk_burn_hides_recompute_generate", LAB5),      # #41: a constant burn
    ("atk_prefork_setup_cgroup_window", LAB6),        # #41: a child forked by the warm-up
    ("atk_sigchld_ign_fork_window", LAB6),            # #41: a child forked in the call
    ("atk_sigchld_ign_fork_generate", LAB5),          # #41: an auto-reaped child's work
    ("atk_flock_relay_generate", LAB5),               # #41: the test's idle worker's work
    ("bug_sliding_window_full_matrix", LAB6),         # item 7
])
def test_what_the_lesson_teaches_is_graded(report, name, lab):
    """Each lesson's point, missed, loses points (the exact tests: NEW_TESTS)."""
    bad = failed(report(name, lab))
    assert set(bad) == set(NEW_TESTS[name]), bad
    for test, words in NEW_TESTS[name].items():
        for w in words:
            assert w in bad[test], (test, w, bad[test])


# fixture -> {the tests it must fail: words their messages must hold}
NEW_TESTS = {
    "bug_online_softmax_missing": {"test_chunked_memory_flat_in_the_number_of_keys": [
        "(64, 65536) float32 score matrix"]},
    "bug_dense_below_threshold": {CHUNKED_MEMORY: ["L=2048", "(2048, 2048) float32 score matrix"],
                                  "test_chunked_memory_flat_in_the_number_of_keys": []},
    "bug_running_max_zero_init": {"test_chunked_rows_of_very_negative_scores": []},
    "atk_burn_short_length": {"test_linear_attention_work_grows_linearly": [
        "the course's reference on the same input"]},
    "bug_generate_recomputes_prefix": {"test_generate_work_per_new_token": [
        "with n = 33 it took", "the whole sequence again at every step"]},
    "atk_burn_hides_recompute_generate": {"test_generate_work_per_new_token": [
        "the course's reference on the same input"]},
    # A fork is refused (EPERM): this one then builds the matrix in the worker itself.
    "atk_prefork_setup_cgroup_window": {"test_sliding_window_memory_linear_in_length": [
        "L=8192", "square of the length"]},
    # ... and this one cannot answer at all: every test that calls it says why.
    "atk_sigchld_ign_fork_window": {
        name: ["PermissionError"] for name in (
            "test_sliding_window_memory_linear_in_length",
            "test_sliding_window_matches_full_attention_with_band_mask",
            "test_sliding_window_edge_windows")},
    # Its helper, the test's own worker, has ended before the measured calls: it computes
    # alone (after 0.3 s of waiting for an answer, asleep) and grows as a recompute does.
    "atk_flock_relay_generate": {"test_generate_work_per_new_token": [
        "with n = 33 it took", "the whole sequence again at every step"]},
    "atk_sigchld_ign_fork_generate": {
        name: ["PermissionError"] for name in (
            "test_generate_work_per_new_token", "test_generate_matches_greedy_without_cache",
            "test_generate_batch_matches_greedy_without_cache",
            "test_generate_zero_new_tokens_returns_prompt", "test_value_error_past_max_len")},
    "bug_sliding_window_full_matrix": {"test_sliding_window_memory_linear_in_length": [
        "L=2048", "grew"]},
}


@pytest.mark.parametrize("name, lab", [("ok_lab5_sdpa", LAB5), ("ok_lab5_own_lab1", LAB5),
                                       ("ok_lab5_preallocated_cache", LAB5),
                                       ("ok_lab5_einsum", LAB5), ("ok_lab6_unfold", LAB6),
                                       ("ok_lab6_gathered_window", LAB6),
                                       ("ok_lab6_float64_window", LAB6),
                                       ("ok_lab6_block_gather_window", LAB6),
                                       ("ok_lab6_einsum_streams", LAB6),
                                       ("ok_lab6_single_chunk_fast_path", LAB6)])
def test_correct_labs_keep_full_marks(report, name, lab):
    """Correct code in other styles (sdpa steps, attention through lab 1, a preallocated
    cache, einsum; unfolded, gathered, float64 and block-gathered windows (#41), cumsum of outer products,
    a single-chunk fast path whose warm-up must take the measured call's path: #26 attack
    report item 5) passes every resource test."""
    assert failed(report(name, lab)) == {}


SPIN = b'''
import time

def spin(cpu_s):
    end = time.process_time() + cpu_s
    while time.process_time() < end:
        pass
    return 1

def nap(s):
    time.sleep(s)
    return 1
'''


def test_a_wall_limit_follows_the_cpu_the_worker_was_given(zygote):
    """Item 9: beside two CPU hogs (`yes`), 1.5 CPU-s of work under a 2 s wall limit takes
    longer than 2 s of wall time: the time the worker waited for a CPU is added to its limit
    (grader/sandbox/channel.py), so it answers; a sleep, never waiting for a CPU, still runs
    out of time."""
    import subprocess

    from grader.engine.student import Session, StudentError, StudentLab
    from grader.sandbox import make_scratch
    scratch = make_scratch({"lab9_spin.py": SPIN})
    session = Session(zygote=zygote, submission_dir=scratch.name, forbidden={},
                      solutions=str(paths.KIT / "solutions"))
    lab = StudentLab(session, "lab9_spin")
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(2)]
    try:
        session.start_test(2.0, lab="lab9_spin")
        import time
        t0 = time.monotonic()
        assert lab.call("spin", 1.5) == 1
        took = time.monotonic() - t0
        session.start_test(1.0, lab="lab9_spin")
        with pytest.raises(StudentError) as info:
            lab.call("nap", 30)
        assert info.value.kind == "timeout"
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        session.close()
        scratch.cleanup()
    print(f"spin 1.5 CPU-s beside two hogs: {took:.2f} s wall")


def test_a_tests_later_call_keeps_the_time_load_took_from_its_earlier_ones(zygote):
    """Item 9 across calls: beside two CPU hogs, 1.2 CPU-s then 0.3 CPU-s under one 2 s
    test limit. The first call answers inside its limit but load takes ~0.6 s of it; that
    time moves the test's deadline, so the second call (which alone would have ~0.2 s left)
    answers too. 1.5 CPU-s is within the limit: a timeout here would be the machine's."""
    import subprocess

    from grader.engine.student import Session, StudentLab
    from grader.sandbox import make_scratch
    scratch = make_scratch({"lab9_spin.py": SPIN})
    session = Session(zygote=zygote, submission_dir=scratch.name, forbidden={},
                      solutions=str(paths.KIT / "solutions"))
    lab = StudentLab(session, "lab9_spin")
    session.start_test(10.0, lab="lab9_spin")
    lab.call("spin", 0.0)                        # the worker started before the hogs
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(2)]
    try:
        session.start_test(2.0, lab="lab9_spin")
        limit_at = session.deadline
        assert lab.call("spin", 1.2) == 1
        assert lab.call("spin", 0.3) == 1
        moved = session.deadline - limit_at
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        session.close()
        scratch.cleanup()
    assert 0 < moved <= 3.0 * 2.0, moved
    print(f"deadline moved {moved:.2f} s for load")


def test_no_cgroup_is_left_behind(report):
    """Every measured call's cgroups are removed with its worker."""
    import os

    from grader.sandbox import memcg
    report("ok_lab6_broadcast_shapes", LAB6)
    where = memcg.layout()
    if where is None:
        pytest.skip("no memory cgroup on this machine")
    assert not list(where.parent.glob(f"attention-worker-{os.getpid()}-*"))


RACE = b'''
import mmap
import threading

SIZE = 48 << 20
_state = {"calls": 0, "touched": 0}


def _cgroup():
    with open("/proc/self/cgroup") as fh:
        return fh.read()


def _touch(start):
    region = mmap.mmap(-1, SIZE)
    _state["region"] = region
    for offset in range(0, SIZE, 4096):
        if offset % (64 * 4096) == 0 and _cgroup() != start:
            break                       # moved into the measured call's group: stop
        region[offset] = 1
        _state["touched"] = offset + 4096


def work(n):
    _state["calls"] += 1
    if _state["calls"] == 1:            # the warm-up: a thread goes on after its reply
        threading.Thread(target=_touch, args=(_cgroup(),), daemon=True).start()
        return 0
    return _state["touched"]
'''


def test_memory_touched_between_the_warm_up_and_the_measured_call_is_counted(zygote):
    """Re-attack of #26 (a race): a thread left by the warm-up touched pages after the
    warm-up's memory was read and before the worker was moved into the measured call's
    cgroup, so they counted nowhere, and the measured call used them for free (a dense
    chunked_attention passed the memory test 2 runs in 4). What the warm-up left held is
    read after the measured call: every page touched before the move is in it."""
    from grader.engine.student import Session, StudentLab
    from grader.sandbox import make_scratch, memcg
    if not memcg.available():
        pytest.skip("no memory cgroup here: the fallback reads resident sizes")
    scratch = make_scratch({"lab9_race.py": RACE})
    session = Session(zygote=zygote, submission_dir=scratch.name, forbidden={})
    try:
        session.start_test(30.0, lab="lab9_race")
        got = StudentLab(session, "lab9_race").measure("work", 1, warmup=(0,))
    finally:
        session.close()
        scratch.cleanup()
    touched = got.value                 # bytes the thread touched before it was moved
    assert got.kept_bytes + got.peak_bytes >= touched - 2 * 2**20, (touched, got)
