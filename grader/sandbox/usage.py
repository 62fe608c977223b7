"""What a worker used, read by the grader from the kernel's accounting (``/proc/<pid>``).

Runs in the trusted process. Nothing here asks the worker anything: student code runs in
the worker and could report whatever it liked, but it cannot change what the kernel counts
for its process. ``Usage`` is one reading; ``measured(before, after)`` the difference over a
call.

- memory, where the platform has a memory cgroup (``grader.sandbox.memcg``): the peak of a
  fresh cgroup the worker is moved into just before the call, which counts only the pages the
  call itself faults in, so nothing the call drops (library pages, ``munmap``) lowers it.
  ``charged`` adds what the lab's import left held and takes off the inputs' bytes; what
  the warm-up call kept is reported apart (``kept_bytes``), and each memory test forgives
  only part of it (``warmup_allowance``).
- memory elsewhere (the fallback): the resident set's high-water mark (``VmHWM``). Before a measured call the grader
  resets it to the current resident size (writing 5 to ``/proc/<pid>/clear_refs``; the
  worker's own ``/proc`` is mounted read-only, so student code cannot reset it again during
  the call). Where the reset is not allowed (a plain-mode worker of another user), the mark
  from before the call is the baseline, which can only make the peak look smaller than it was
  if the worker's earlier peak was higher: a fresh worker's only earlier work is importing
  the lab and reading the inputs.
- work: the CPU time of every thread of the worker, in nanoseconds (``schedstat``), or the
  process's own tick count where larger (threads that exited are in it, at 10 ms grain).
- other processes: the faults and CPU time of children the worker waited for (``cminflt``,
  ``cutime``) and whether any child is alive: a measured call must do its work in the
  worker itself, or what it used is not in the reading.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TICK_NS = 1_000_000_000 // (os.sysconf("SC_CLK_TCK") or 100)


@dataclass(frozen=True)
class Usage:
    """One reading of a worker's accounting."""
    resident: int           # bytes resident now (VmRSS)
    peak: int               # bytes, the resident high-water mark (VmHWM)
    cpu_ns: int             # CPU time of the worker's threads
    child_faults: int       # minor faults of the children it waited for
    child_ticks: int        # CPU ticks of the children it waited for


@dataclass(frozen=True)
class Measured:
    """What one call used: its peak memory above the resident size before it, its CPU time,
    and whether another process did part of the work (then the two figures are not the
    call's)."""
    peak_bytes: int
    cpu_s: float
    other_processes: bool
    kept_bytes: int = 0     # held after the warm-up call beyond the lab's import (see charged)
    inputs_bytes: int = 0   # the measured call's inputs (its request's tensors), taken off
    relay_s: float = 0.0    # CPU time taken off for moving its calls' bytes (relay_cost)


def _status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) * 1024       # reported in kB
    return out


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as fh:
        text = fh.read()
    return text[text.rindex(")") + 2:].split()    # the fields after "(comm)", from state on


def _threads_cpu_ns(pid: int) -> int:
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue                                # a thread that just ended
    return total


def accounting_available() -> bool:
    """Whether this machine's kernel shows a running process's memory and CPU (/proc):
    Linux does; where it does not (macOS, Windows: the portable backend), the figures the
    resource tests judge are not measured here (``engine.student.NotMeasuredHere``)."""
    return os.path.exists("/proc/self/stat")


def run_delay_ns(pid: int) -> int:
    """Nanoseconds the worker's threads spent runnable but waiting for a CPU (the second
    field of ``schedstat``): time the machine's load took from it, never its own doing (a
    sleeping or blocked thread is not runnable). 0 where unreadable."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total


def reading(pid: int) -> Usage:
    """The worker's accounting now. OSError if the process is gone."""
    status = _status(pid)
    fields = _stat_fields(pid)
    # proc(5), counted from field 3 (state) as index 0: minflt 10 -> 7, cminflt 11 -> 8,
    # utime 14 -> 11, stime 15 -> 12, cutime 16 -> 13, cstime 17 -> 14.
    own_ticks = int(fields[11]) + int(fields[12])
    return Usage(resident=status.get("VmRSS", 0), peak=status.get("VmHWM", 0),
                 cpu_ns=max(_threads_cpu_ns(pid), own_ticks * TICK_NS),
                 child_faults=int(fields[8]), child_ticks=int(fields[13]) + int(fields[14]))


def reset_peak(pid: int) -> bool:
    """Set the worker's high-water mark to its resident size now; False if not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


MIB = 1 << 20
# The most memory kept from the warm-up call that any memory test forgives: one-time costs
# of the libraries a function uses that the zygote has not already paid (it pays the known
# big one: torch.broadcast_shapes' first call imports sympy, +35 MB). Each test forgives
# less: ``warmup_allowance``.
WARMUP_ALLOWANCE = 48 * MIB


def warmup_allowance(looks_for: float, limit: float) -> int:
    """The memory kept from the warm-up that a memory test forgives, in proportion to what
    it looks for: half the margin between the smallest thing it looks for (``looks_for``
    bytes: a (64, 65536) score block, 16 MiB) and its limit (``limit`` bytes), at most
    ``WARMUP_ALLOWANCE``. A scratch buffer kept from the warm-up and reused by the measured
    call then hides at most that much: what the test looks for still shows above the limit
    (8 MiB budget, 16 MiB block: 4 MiB forgiven). 0 where the thing is no larger than the
    limit."""
    return int(max(0.0, min(WARMUP_ALLOWANCE, (looks_for - limit) / 2)))


def charged(*, imported: int, call_peak: int, inputs: int) -> int:
    """The bytes a measured call is charged, before what it kept from its warm-up (see
    ``warmup_allowance``): what the lab's own import left held (an arena the call reuses is
    the call's) and the peak of the call's window, which opens before its inputs are sent
    (receiving them is in it), less the inputs' own bytes, computed by the grader."""
    return max(0, imported) + max(0, call_peak - inputs)


def measured(before: Usage, after: Usage, *, children_alive: bool) -> Measured:
    """The call's use between two readings (``before`` taken right after ``reset_peak``, or
    without a reset: then the earlier peak is the baseline)."""
    baseline = max(before.resident, before.peak)
    return Measured(peak_bytes=max(0, after.peak - baseline),
                    cpu_s=max(0, after.cpu_ns - before.cpu_ns) / 1e9,
                    other_processes=children_alive or after.child_faults > before.child_faults
                    or after.child_ticks > before.child_ticks)
