"""The trusted side's value caches (grader.engine.memo) are bounded by bytes, keys and values
together, so a grading process's memory stays flat however many students it grades (#28):
lab 8's checks key on each student's weights, ~0.7 MB of key bytes a student."""

from __future__ import annotations

import tracemalloc

import pytest
import torch

from grader.engine import memo
from grader.engine.memo import ValueCache, held_bytes, memoized


def test_the_byte_bound_holds_least_recently_used_first_out():
    cache = ValueCache(max_bytes=12_000)     # three 3 kB entries (with their keys), not four
    blob = lambda i: bytes([i]) * 3_000            # noqa: E731
    for i in range(3):
        assert cache.get_or_compute(("k", i), lambda i=i: blob(i)) == blob(i)
    assert len(cache) == 3 and cache.bytes <= cache.max_bytes
    cache.get_or_compute(("k", 0), lambda: pytest.fail("a hit is not recomputed"))
    cache.get_or_compute(("k", 3), lambda: blob(3))          # evicts the least recent: 1
    assert list(cache.entries) == [("k", 2), ("k", 0), ("k", 3)]
    assert cache.bytes == sum(size for _, size in cache.entries.values()) <= cache.max_bytes
    # an entry larger than the whole bound is handed out, never kept (and evicts nothing)
    big = cache.get_or_compute(("big",), lambda: b"x" * 20_000)
    assert len(big) == 20_000 and list(cache.entries) == [("k", 2), ("k", 0), ("k", 3)]


def test_key_and_value_bytes_are_both_counted():
    cache = ValueCache(max_bytes=1 << 30)
    key = memo.value_key(torch.zeros(1000))                   # 4000 bytes of key
    cache.get_or_compute(key, lambda: torch.zeros(2000))      # 8000 bytes of value
    assert 12_000 <= cache.bytes < 12_000 + 2_000
    # a view keeps its whole storage alive: counted as the storage
    assert held_bytes(torch.zeros(10_000)[:10]) >= 40_000


def test_memoized_results_are_copies_and_bounded():
    calls = []

    @memoized(max_bytes=50_000)
    def double(x):
        calls.append(1)
        return x * 2

    x = torch.ones(100)
    a = double(x)
    a.fill_(0)                                  # changing what we got changes no cache
    assert torch.equal(double(x), torch.full((100,), 2.0)) and len(calls) == 1
    for i in range(200):
        double(torch.full((100,), float(i)))
    assert double.cache.bytes <= 50_000 < 200 * 800
    assert {"name": double.cache.name, "entries": len(double.cache), "bytes": double.cache.bytes,
            "max_bytes": 50_000} in memo.cache_report()


def test_lab8_checks_keyed_on_many_students_weights_stay_within_the_bound(monkeypatch):
    """Distinct weights, as a class's trained models are: the check's cache keeps at most
    its byte bound, measured from outside by the Python memory the process retains (the
    keys are bytes objects), not only by the cache's own count. The bound is lowered to
    4 MiB so that three bounds' worth of students is ~20 reference forwards."""
    from grader.suites import _training

    check = _training.teacher_forced_loss
    bound = 4 << 20
    monkeypatch.setattr(check.cache, "max_bytes", bound)
    src, tgt = _training.heldout(torch.Generator().manual_seed(0), n=4)
    weights = _training.reference().Seq2SeqTransformer().state_dict()
    key_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    students = 3 * bound // key_bytes + 1        # their keys alone: three times the bound
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                     # tiny forwards: threads only contend
    check.cache.clear()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(students):
            distinct = {k: v + i * 1e-3 if v.is_floating_point() else v
                        for k, v in weights.items()}
            check(distinct, src, tgt)
            assert check.cache.bytes <= bound
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        torch.set_num_threads(threads)
        check.cache.clear()
    assert students * key_bytes > 3 * bound
    assert retained < bound * 1.25, f"{retained / 2**20:.1f} MiB retained after {students} students"
