"""Value-keyed caches for the trusted side: references and mistake replays.

Every test draws its inputs from a generator seeded by the test's id, so every submission
of a batch asks for the same references, and a failed test's mistake diagnosis replays the
catalogue's wrong implementations on the same requests. A grading process computes each of
those once: keys are the arguments' values (tensors by dtype, shape and bytes), never their
identity, and callers get copies, so a test that modifies what it got cannot change the
cache. Only for pure computations: no global random state that is not seeded from the
arguments, no autograd graphs.

Some keys differ per student (lab 8's checks key on each student's trained weights, ~0.7 MB
of key bytes; a replay can carry what the student's code returned), so a count of entries
bounds nothing: a grading process of a large class would keep every student's weights.
Every cache is bounded by the bytes it holds, key bytes plus value bytes
(``held_bytes``), least recently used first out; an entry larger than the whole bound is
computed and handed out, never kept. ``cache_report()`` lists every cache of the process
and what it holds (benchmarks/bench_memo_memory.py, tests/test_memo.py).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import weakref
from collections import OrderedDict

import torch

# Bytes per cache, keys and values together. The references of a whole class are the same
# for every student and hold well under this (each cache < 4 MB on the kit's labs); lab 8's
# per-student keys (~0.7 MB) fit ~20 at a time, and each is only reused within its own
# submission's tests.
CACHE_BYTES = 16 << 20
ENTRY_OVERHEAD = 256        # the entry's own dict slot, tuples and bookkeeping (estimate)
_OBJECT_OVERHEAD = 56       # a tuple, a float, a small object (CPython, 64-bit, estimate)

_CACHES: "weakref.WeakValueDictionary[str, ValueCache]" = weakref.WeakValueDictionary()


def value_key(value):
    """A hashable key, equal exactly when the values are (tensors: dtype, shape, bytes)."""
    if isinstance(value, torch.Tensor):
        data = value.detach().contiguous()
        return ("tensor", str(data.dtype), tuple(data.shape), data.numpy().tobytes())
    if isinstance(value, dict):
        return ("dict", tuple((k, value_key(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(value_key(v) for v in value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value).__name__, value)
    raise TypeError(f"cannot key a cache on a {type(value).__name__}")


def copy_value(value):
    """A copy of tensors, also inside lists, tuples and dicts; other values as they are."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        return tuple(copy_value(v) for v in value)
    if isinstance(value, list):
        return [copy_value(v) for v in value]
    if isinstance(value, dict):
        return {k: copy_value(v) for k, v in value.items()}
    return value


def held_bytes(value, _depth: int = 0) -> int:
    """About how many bytes ``value`` keeps alive: a tensor its whole storage (a view keeps
    all of it), bytes and str their length, containers and dataclasses what they hold plus
    a small overhead each, anything else its shallow size."""
    if _depth > 32:                 # deeper than any key or result the grader builds
        return _OBJECT_OVERHEAD
    if isinstance(value, torch.Tensor):
        try:
            storage = value.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):      # a tensor without a plain storage
            storage = value.numel() * value.element_size()
        return storage + 200        # the tensor object and its metadata
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        return len(value) + _OBJECT_OVERHEAD
    if isinstance(value, dict):
        return _OBJECT_OVERHEAD + sum(held_bytes(k, _depth + 1) + held_bytes(v, _depth + 1)
                                      for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return _OBJECT_OVERHEAD + sum(held_bytes(v, _depth + 1) for v in value)
    if isinstance(value, BaseException):
        return sys.getsizeof(value) + held_bytes(value.args, _depth + 1)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _OBJECT_OVERHEAD + sum(held_bytes(getattr(value, f.name), _depth + 1)
                                      for f in dataclasses.fields(value))
    return sys.getsizeof(value)


class ValueCache:
    """A least-recently-used map from value keys to results, bounded by the bytes of its
    keys and values (``max_bytes``), not by a count of entries."""

    def __init__(self, max_bytes: int = CACHE_BYTES, *, name: str | None = None):
        self.max_bytes = int(max_bytes)
        self.entries: OrderedDict = OrderedDict()      # key -> (value, bytes of the entry)
        self.bytes = 0
        self.name = name or f"cache-{id(self):x}"
        _CACHES[self.name] = self

    def get_or_compute(self, key, compute):
        found = self.entries.get(key)
        if found is not None:
            self.entries.move_to_end(key)
            return found[0]
        value = compute()
        size = held_bytes(key) + held_bytes(value) + ENTRY_OVERHEAD
        if size > self.max_bytes:
            return value            # bigger than the whole cache: never kept
        self.entries[key] = (value, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.bytes -= dropped
        return value

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.entries)


def cache_report() -> list[dict]:
    """Every live cache of this process: name, entries, bytes held, bound."""
    return [{"name": c.name, "entries": len(c), "bytes": c.bytes, "max_bytes": c.max_bytes}
            for c in sorted(_CACHES.values(), key=lambda c: c.name)]


def memoized(fn=None, *, max_bytes: int = CACHE_BYTES):
    """Cache a pure function on its arguments' values; callers get copies of the result.
    ``@memoized`` or ``@memoized(max_bytes=...)``; the cache is ``wrapper.cache``."""
    if fn is None:
        return functools.partial(memoized, max_bytes=max_bytes)
    cache = ValueCache(max_bytes, name=f"{fn.__module__}.{fn.__qualname__}")

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        key = (value_key(args), value_key(kwargs))
        return copy_value(cache.get_or_compute(key, lambda: fn(*args, **kwargs)))

    wrapper.cache = cache
    return wrapper
