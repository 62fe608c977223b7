"""Resource grading that the student's code cannot move (issue #26).

Each case is a fixture submission (tests/fixtures/submissions/) graded as ``grader grade``
grades it; the assertions are on the lab report: which tests fail, and what their
messages say was measured.
"""

from __future__ import annotations

import pytest

from helpers import grade, make_submission

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
    assert "(4096, 4096) float32 score matrix" in bad[CHUNKED_MEMORY]


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
    assert "it was materialised" in bad[CHUNKED_MEMORY]
