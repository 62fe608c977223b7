"""CPU seconds of gradings, split by lab (and, when asked, by test): what a batch reports.

A reading is the CPU time of this process (every thread: the pytest thread runs the tests),
of the sandbox zygote with every child it has reaped, and of each worker (and keeper) it
forked that has not been reaped yet: ``Session`` names each one it spawns (``watch``). A
worker's time is counted while it runs, and moves into its parent's reaped-children account
when it is reaped, so the sum does not jump when the zygote reaps a worker some
milliseconds after the grader killed it: the lab that used the worker keeps its time.

``switch(lab, test)`` charges the CPU time since the last switch to the key in force and
puts the new one in force; time outside any lab (sanitizing, scoring, writing the student's
files, a worker's exit after its lab, waiting for the next student) is charged to
``OUTSIDE``. Every CPU-second between the clock's first reading and its last is charged to
exactly one key, so the parts add up to the whole.

Granularity: the sandbox's processes are read from ``/proc/<pid>/stat`` in clock ticks
(10 ms); each reading is off by less than a tick per process, and the errors do not add up
over readings (every reading is of a running total).
"""

from __future__ import annotations

import contextlib
import os
import time

OUTSIDE = ""                      # the key of time spent outside any lab
# /proc's clock ticks; where there is no sysconf (Windows) /proc is absent too.
TICK_S = 1.0 / ((os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0) or 100)


def _own_cpu_s() -> float:
    # This process's CPU time, user and system: the same figure as getrusage(RUSAGE_SELF),
    # on every platform.
    return time.process_time()


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(own ticks, reaped children's ticks, start time) of ``pid``; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2:].split()      # from field 3 (state) on
    with contextlib.suppress(IndexError, ValueError):
        # proc(5): utime 14, stime 15, cutime 16, cstime 17, starttime 22 (index 19 here)
        return (int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]),
                fields[19].decode())
    return None


class LabClock:
    """CPU seconds by (lab, test) of what this process and its sandbox spend.

    ``sandbox_pid``: the zygote (None: no sandbox process, as in the in-process floor of
    ``benchmarks/in_process_floor.py``). ``by_test``: charge each test apart (else a switch
    within the same lab is a no-op: a batch wants labs, and a reading costs ~0.1-0.5 ms).
    """

    def __init__(self, sandbox_pid: int | None, *, by_test: bool = False):
        self.sandbox_pid = sandbox_pid
        self.by_test = by_test
        # pid -> (its start time: a reused pid is not it; whether it reaps a watched one)
        self._watched: dict[int, tuple[str, bool]] = {}
        self.key: tuple[str, str] = (OUTSIDE, "")
        self.spent: dict[tuple[str, str], float] = {}
        self._last = self.reading()

    def watch(self, worker: int | None, *, keeper: int | None = None) -> None:
        """Count this worker (and the keeper that reaps it) until they are reaped."""
        for pid, reaps in ((worker, False), (keeper, True)):
            if pid and pid not in self._watched and (got := _stat(pid)) is not None:
                self._watched[pid] = (got[2], reaps)

    @property
    def unreaped(self) -> int:
        """Watched processes not reaped at the last reading."""
        return len(self._watched)

    def switch(self, lab: str, test: str = "") -> None:
        """Charge the time since the last switch to the key in force; ``(lab, test)`` from
        now (``OUTSIDE`` for no lab)."""
        key = (lab, test if self.by_test else "")
        if key == self.key:
            return
        now = self.reading()
        self.spent[self.key] = self.spent.get(self.key, 0.0) + (now - self._last)
        self._last, self.key = now, key

    def take(self) -> dict[tuple[str, str], float]:
        """What was charged since the last ``take`` (the time in force included, charged to
        its key, which stays in force): CPU seconds by (lab, test)."""
        now = self.reading()
        self.spent[self.key] = self.spent.get(self.key, 0.0) + (now - self._last)
        self._last = now
        spent, self.spent = self.spent, {}
        return spent

    def reading(self) -> float:
        """CPU seconds so far of this process and the sandbox's processes (see the module)."""
        reapers = [self.sandbox_pid, *(p for p, (_, reaps) in self._watched.items() if reaps)]
        workers = [p for p, (_, reaps) in self._watched.items() if not reaps]
        for _ in range(8):
            _, reaped_before = self._read(reapers)
            worker_ticks, seen = self._read(workers)
            reaper_ticks, reaped = self._read(reapers)
            # A worker reaped while it was being read moved its time into its reaper's
            # account (or a keeper into the zygote's): read again until the reapers'
            # accounts of reaped children stood still around the workers' reading.
            if reaped == reaped_before:
                break
        for pid in [p for p in self._watched if p not in seen and p not in reaped]:
            del self._watched[pid]                  # reaped: its time is its parent's now
        return _own_cpu_s() + (worker_ticks + reaper_ticks) * TICK_S

    def _read(self, pids: list[int | None]) -> tuple[int, dict[int, int]]:
        """Ticks of ``pids`` with their reaped children's, and pid -> the latter, of those
        still there."""
        ticks, seen = 0, {}
        for pid in pids:
            if pid is None:
                continue
            got = _stat(pid)
            if got is None or (pid in self._watched and got[2] != self._watched[pid][0]):
                continue
            ticks += got[0] + got[1]
            seen[pid] = got[1]
        return ticks, seen


def by_lab(spent: dict[tuple[str, str], float]) -> dict[str, float]:
    """CPU seconds by lab (``OUTSIDE`` for time outside any lab) of ``LabClock.spent``."""
    labs: dict[str, float] = {}
    for (lab, _test), seconds in spent.items():
        labs[lab] = labs.get(lab, 0.0) + seconds
    return labs
