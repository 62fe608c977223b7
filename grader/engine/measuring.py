"""Resource tests: a call measured in a fresh worker of its own, from the kernel's accounting
(a memory cgroup's peak or the resident high-water mark, the CPU time), the reference
workers it calls into included (``_MeasuredReferences``). Where the kernel shows nothing
(the portable backend without /proc): ``NotMeasuredHere``."""

from __future__ import annotations

import time
from dataclasses import replace


from grader.sandbox import (SandboxError, Worker, memcg, protocol, usage, wire)
from grader.sandbox.usage import Measured
from grader.engine.failures import (NotMeasuredHere, RecordedCall,
                                     StudentError)


class Measuring:
    """``Session``'s part that measures a call (``measure``) or reads a worker's CPU."""

    def measure(self, lab: str, req: dict, warmup: dict | None = None, *,
                reference: bool = False) -> tuple[object, Measured]:
        """``req`` (a call or grad request) in a fresh worker of its own, measured from the
        kernel's accounting (``grader.sandbox.usage``, ``grader.sandbox.memcg``): (the
        reply's value, what the call used above its inputs). ``warmup``: a request run
        first in the same worker, on other inputs (``StudentLab.measure`` draws them), so
        that a library's one-time cost (a lazy import, a first-call cache) is not the
        call's; what it leaves held is ``kept_bytes``. ``reference``: the course's
        reference answers instead, in a worker like the student's (its time is the test's
        too); not recorded. Never sent ahead; recorded like every call.

        The order is the guarantee: the worker imports the libraries, the lab and runs the
        warm-up before it holds anything of ``req``; the measurement (a fresh cgroup's
        peak, or the reset high-water mark, and the CPU time) starts before ``req`` is sent,
        so receiving and decoding its inputs is inside it whatever the lab's code patched in
        the worker, and the inputs' own bytes (the frame's payload, counted here) are taken
        off the peak."""
        if not usage.accounting_available():
            raise NotMeasuredHere("The memory and work of this call")
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self._timeout(lab)
        worker = setup = call = None
        self.end_student_workers()
        try:
            worker = self._spawn(lab, reference=reference)
            # Calls into other labs go to reference workers of this measurement's own, and
            # what they use during the measured call is the call's (``_MeasuredReferences``).
            self.measuring = _MeasuredReferences()
            setup = memcg.group()
            if setup is not None:
                setup.add(worker.pid)       # what the import and the warm-up hold is read here
            self._exchange(worker, lab, protocol.prepare_request())    # libraries, mallopt
            held = self._memory_now(worker, setup)   # the lab not imported yet
            self._exchange(worker, lab, protocol.probe_request([]))     # import the lab
            imported = self._memory_now(worker, setup)
            if warmup is not None:
                self._exchange(worker, lab, warmup)
            warmed = self._memory_now(worker, setup)
            frame = wire.encode(req)
            inputs = wire.PREFIX.unpack_from(frame)[1]      # the bytes of its tensors
            if setup is not None:
                call = memcg.group()
            if call is not None:
                call.add(worker.pid)        # only what the worker faults in from here counts
            else:
                usage.reset_peak(worker.pid)
            self.measuring.start(call)
            # A process alive as the call starts (one the warm-up forked, still in
            # ``setup``, serving the call from there) would do its work where nothing of the
            # call is read: the call's figures are then not the call's.
            started_alive = worker.has_children()
            before = usage.reading(worker.pid)
            moved = self.moved.copy()
            value = self._exchange(worker, lab, frame=frame)
            after = usage.reading(worker.pid)
            used = usage.measured(before, after,
                                  children_alive=started_alive or worker.has_children())
            moved, own_cpu_s = self.moved.since(moved), used.cpu_s
            others = self.measuring.used()
            used = replace(used, cpu_s=used.cpu_s + others.cpu_s)
            if setup is not None and call is not None:
                # Read again now: pages the worker touched after the warm-up's reply and
                # before its move into ``call`` (a thread the warm-up left running) stay
                # charged to ``setup``; read only before, they counted nowhere.
                warmed = max(warmed, self._memory_now(worker, setup))
            # With a cgroup, the reference workers are in it (its peak is of the sum).
            call_peak = call.peak() if call is not None else used.peak_bytes + others.peak_bytes
            used = replace(used, peak_bytes=usage.charged(
                imported=imported - held, call_peak=call_peak, inputs=inputs),
                kept_bytes=max(0, warmed - imported), inputs_bytes=inputs)
        except StudentError as exc:
            if reference and exc.kind != "timeout":   # the grader's fault, never a score
                self.fault = self.fault or SandboxError(f"the reference {lab} failed: {exc}")
            else:
                self._record(RecordedCall(lab, req, error=exc))
            raise
        except OSError as exc:          # the worker's /proc went away: it is gone
            error = StudentError(kind="crash", lab=lab,
                                 message=f"the worker ended before it could be measured ({exc})")
            if reference:
                self.fault = self.fault or SandboxError(f"the reference {lab} failed: {exc}")
            else:
                self._record(RecordedCall(lab, req, error=error))
            raise error from None
        finally:
            if self.measuring is not None:
                self.measuring.end()
            self.measuring = None
            if worker is not None:
                worker.kill()
            for group in (setup, call):
                if group is not None:
                    group.remove()
        # Moving its calls' bytes is the relay's (``relay_cost``): the rate is calibrated, if
        # it is not yet, now that the measured worker and everything it started are gone.
        relay_s = self._framing_s(lab, moved, own_cpu_s)
        used = replace(used, cpu_s=used.cpu_s - relay_s, relay_s=relay_s)
        if not reference:
            self._record(RecordedCall(lab, req, value=value, used=used))
        return value, used

    @staticmethod
    def _memory_now(worker: Worker, group) -> int:
        """Bytes the worker holds now: charged to its cgroup, or resident (the fallback)."""
        return group.usage() if group is not None else usage.reading(worker.pid).resident

    @staticmethod
    def _cpu_reading(worker: Worker, *, final: bool) -> usage.Usage:
        """The worker's accounting from /proc; where there is none (the portable backend on
        macOS, Windows), its CPU time from the OS (``portable.WorkerProcess.cpu_ns``:
        ``final`` ends the worker to read its total), else NotMeasuredHere."""
        if usage.accounting_available():
            return usage.reading(worker.pid)
        cpu_ns = worker.process.cpu_ns(final=final) if worker.process is not None else None
        if cpu_ns is None:
            raise NotMeasuredHere("The training's CPU time")
        return usage.Usage(resident=0, peak=0, cpu_ns=cpu_ns, child_faults=0, child_ticks=0)


class _MeasuredReferences:
    """The reference workers answering a measured call's calls into other labs, fresh for
    it and ended with it: what they use in the measured call's window is the call's (#25,
    "what the reference worker spends for a student is the student's"). Those of its
    warm-up (or its import) pay their one-time costs there, as the student's worker does;
    from ``start`` each is in the call's memory cgroup (the cgroup's peak is then that of
    the worker and the reference workers together), or, without one, its resident peak
    is reset and what it rose by is added. CPU time: each answer's own, as the reference
    worker timed the course's function on the student's inputs (``spent``; at most what
    the kernel counted for the exchange), so the call pays for the work it handed over,
    not for the relay's framing, which an inline computation would not have. A reference
    worker first asked during the call itself joins at once."""

    def __init__(self):
        self.workers: dict = {}             # (calling lab, other lab) -> Worker
        self.group = None
        self.started = False
        self.cpu_ns = 0                     # the answers' CPU time since ``start``
        self.calls = 0
        self._base: dict = {}               # pid -> Usage at ``start`` (or when it joined)

    def joined(self, worker: Worker) -> None:
        if self.started:
            self._charge(worker)

    def start(self, group) -> None:
        self.group, self.started = group, True
        for worker in self.workers.values():
            if worker.alive:
                self._charge(worker)

    def spent(self, cpu_ns: int) -> None:
        if self.started:
            self.cpu_ns += max(0, cpu_ns)
            self.calls += 1

    def _charge(self, worker: Worker) -> None:
        try:
            if self.group is not None:
                self.group.add(worker.pid)
            else:
                usage.reset_peak(worker.pid)
            self._base[worker.pid] = usage.reading(worker.pid)
        except OSError:
            worker.kill()                   # not measurable: not used (its call fails)

    def used(self) -> Measured:
        """What the reference workers used since ``start``: the answers' CPU time, and
        (summed, an upper bound of their peak together) their resident peaks' rise."""
        peak = 0
        for worker in self.workers.values():
            base = self._base.get(worker.pid)
            if base is None:
                continue
            try:
                now = usage.reading(worker.pid)
            except OSError:
                continue
            peak += max(0, now.peak - max(base.resident, base.peak))
        return Measured(peak_bytes=peak, cpu_s=self.cpu_ns / 1e9, other_processes=False)

    def end(self) -> None:
        for worker in self.workers.values():
            worker.kill()
        self.workers.clear()
