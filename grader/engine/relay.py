"""Calls from one lab into another (protocol "Callbacks"): answered by the course's reference
in a reference worker per (calling lab, other lab), bounded in size, charged to the calling
test (the answer's CPU time), with what moving the bytes costs taken off (``relay_cost``)."""

from __future__ import annotations

import contextlib
import time

import torch

from grader.engine import relay_cost
from grader.sandbox import (SandboxError, WorkerDied, WorkerTimeout, protocol, usage, wire)
from grader.sandbox.channel import Answer, EndWorker
from grader.sandbox.host import make_scratch
from grader.engine.failures import StudentError, _text

MAX_CALLBACK_ELEMENTS = 1 << 22   # numbers in one call into another lab (4 Mi: ~32 MB)
# A number argument of a call into another lab sizes work (a length, a position, a chunk
# count): bounded like the tensors' sizes.
MAX_CALLBACK_SCALAR = MAX_CALLBACK_ELEMENTS
MAX_CALLBACK_REPLY_BYTES = 64 << 20   # a reference worker's reply: value and gradients
# Bytes of tensors relayed between a test's workers and the reference workers, both ways
# (a test's calls into other labs), for each second of the test's time limit: what the
# grading process may copy for one test (its CPU time: ~0.8 s a GB relayed, measured). An
# honest lab 8 training through its own lab 1 relays ~13.6 MB a step (7.1 GB in one
# training here; the reference loop's 3,000 steps at most would be 41 GB, within the 40
# GiB of its 160 s test); lab 2's 10 s tests may relay 2.5 GiB. See docs/security.md.
# The relay holds at most one request and one reply at a time.
MAX_RELAYED_BYTES_PER_SECOND = 256 << 20


class Relay:
    """``Session``'s part that answers a worker's calls into other labs."""

    def _answer(self, lab: str, req, raw: wire.Raw | None = None, *,
                rate: relay_cost.FramingRate | None = None) -> Answer:
        """``_callback``'s value, the CPU time the reference's answer took and (at ``rate``)
        what moving the call's bytes cost the worker: the reply tells the student's worker,
        whose clock (``time.process_time``) then shows what its test is charged for the
        call. Counts the bytes moved (``moved``), a refused call's request too."""
        self.last_answer_cpu_ns = 0
        moved = relay_cost.Moved(request_bytes=len(raw.payload) if raw is not None else 0)
        self.moved.request_bytes += moved.request_bytes
        value = self._callback(lab, req, raw)
        if isinstance(value, wire.Raw):
            moved.reply_bytes = len(value.payload)
            self.moved.reply_bytes += moved.reply_bytes
        return Answer(value, self.last_answer_cpu_ns,
                      rate.of(moved) if rate is not None else 0)

    def _relays(self, lab: str) -> bool:
        """Whether ``lab``'s worker has its calls into other labs answered by the course's
        reference (``_spawn``)."""
        return bool(self.importable.get(lab)) and self.reference_dir is not None

    def _framing_rate(self, lab: str) -> relay_cost.FramingRate:
        """What moving a call's bytes costs a worker of ``lab`` (``relay_cost``), measured
        once per session in a fresh worker whose lab is never imported. A failure is the
        sandbox's (``fault``), never the student's."""
        rate = self.framing_rates.get(lab)
        if rate is not None:
            return rate
        if not usage.accounting_available():
            # No running worker's CPU to calibrate from (the portable backend on macOS or
            # Windows): nothing is taken off, and the figure is the indicative one it says.
            self.framing_rates[lab] = relay_cost.FramingRate()
            return self.framing_rates[lab]
        worker = self._spawn(lab)
        try:
            rate = relay_cost.calibrate(worker)
        except (WorkerTimeout, WorkerDied, RuntimeError, OSError) as exc:
            self.fault = self.fault or SandboxError(f"the relay's calibration failed: {exc}")
            raise StudentError(kind="crash", lab=lab,
                               message=f"the sandbox failed: {exc}") from None
        finally:
            worker.kill()
        self.framing_rates[lab] = rate
        return rate

    def _framing_s(self, lab: str, moved: relay_cost.Moved, cpu_s: float) -> float:
        """CPU seconds taken off a worker's ``cpu_s`` for moving ``moved`` (at most all)."""
        if not (moved.request_bytes or moved.reply_bytes):
            return 0.0
        return min(cpu_s, self._framing_rate(lab).of(moved) / 1e9)

    def _callback(self, lab: str, req, raw: wire.Raw | None = None) -> object:
        """The course's reference answering a call that ``lab``'s code made into another lab:
        checked and bounded here, computed in a reference worker (nothing runs in this
        trusted process but the relay of values). Raises (the student's call then raises,
        with the message) to refuse. ``raw``: the request as it came (``wire.Raw``): its
        bytes go on to the reference worker as they are, and its reply comes back as a
        ``wire.Raw`` to relay as it is (no tensor is rebuilt or copied here); else the
        reply's value."""
        if not isinstance(req, dict) or not isinstance(req.get("args"), list) \
                or not isinstance(req.get("kwargs"), dict) \
                or not isinstance(req.get("seed"), int) \
                or not isinstance(req.get("grad_outputs"), (list, type(None))):
            raise ValueError("a malformed call into another lab")
        inputs = [req["args"], list(req["kwargs"].values()), req["grad_outputs"] or []]
        sent = len(raw.payload) if raw is not None else sum(
            t.numel() * t.element_size() for t in protocol.flat_tensors(inputs))
        cap = self.relay_cap()
        if self.relayed_bytes > cap:
            # Refused for the cap and calling on: each frame would still be read in full.
            raise EndWorker(f"{lab} called another lab again after its calls had moved more "
                            f"than the {cap >> 20} MiB of tensors this test allows, and "
                            "were told so")
        self.relayed_bytes += sent          # refused or not, the relay has read its bytes
        other, target = req.get("lab"), req.get("target")
        if target not in (self.importable.get(lab) or {}).get(other, ()):
            raise ValueError(f"{other}.{target} is not importable by {lab} (only the "
                             "contract functions of earlier labs are)")
        size = sum(t.numel() for t in protocol.flat_tensors(inputs))
        if size > MAX_CALLBACK_ELEMENTS:
            raise ValueError(f"{other}.{target} was given more than {MAX_CALLBACK_ELEMENTS} "
                             "numbers")
        big = _largest_number(inputs)
        if big > MAX_CALLBACK_SCALAR:
            raise ValueError(f"{other}.{target} was given the number {big:.6g}: numbers that "
                             f"size work (lengths, positions, counts) are bounded by "
                             f"{MAX_CALLBACK_SCALAR} in calls into other labs")
        if self.relayed_bytes > cap:
            before = (self.relayed_bytes - sent) >> 20
            raise ValueError(
                f"this test's calls into other labs have moved {before} MiB of tensors to "
                f"and from the course's reference, and at most {cap >> 20} MiB may move in "
                f"this test ({MAX_RELAYED_BYTES_PER_SECOND >> 20} "
                f"MiB for each second of its time limit): a call into another lab copies its "
                f"inputs and its answer between processes, so pass it only what it needs "
                f"(compute large or repeated results once, in {lab}); a further call ends "
                f"the test")
        return self._reference_answer(lab, other, protocol.reference_call_request(req), raw)

    def relay_cap(self) -> int:
        """Bytes of tensors the current test's calls into other labs may move, both ways."""
        return int(MAX_RELAYED_BYTES_PER_SECOND * self.time_limit_s)

    def _reference_answer(self, lab: str, other: str, req: dict, raw: wire.Raw | None = None):
        """``req`` answered by the reference worker of (``lab``, ``other``), within the
        current test's time: its value (a ``wire.Raw`` of it with ``raw``, the student's
        request as it came), or ValueError / RuntimeError saying why not."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise RuntimeError("the test's time limit is spent")
        # A measured call's calls go to reference workers of its own (``measuring``).
        pool = self.measuring.workers if self.measuring is not None \
            else self.reference_workers
        worker = pool.get((lab, other))
        if worker is None or not worker.alive:
            try:
                worker = self.zygote.spawn(
                    submission=self.reference_dir, lab=other,
                    # What the calling lab may not use stays forbidden behind other's name.
                    forbidden=sorted({*self.forbidden.get(other, ()),
                                      *self.forbidden.get(lab, ())}),
                    importable=self.importable.get(other) or {}, answered_by="own")
            except SandboxError as exc:
                self.fault = self.fault or exc
                raise RuntimeError(f"the sandbox failed: {exc}") from None
            worker.reply_bytes = min(worker.reply_bytes, MAX_CALLBACK_REPLY_BYTES)
            self._watch(worker)
            pool[(lab, other)] = worker
            if self.measuring is not None:
                self.measuring.joined(worker)
        try:
            before = usage.reading(worker.pid).cpu_ns
        except OSError:
            before = None
        kept = reply = None
        try:
            if raw is None:
                reply = worker.request(req, timeout_s=remaining)
            else:
                # The request's header with the student's tensors' bytes, as they came.
                worker.send_parts_ahead(wire.parts(
                    {"op": protocol.REFERENCE_CALL, "call": raw.tree}, raw.payload), count=1)
                del raw
                reply, kept = worker.receive(timeout_s=remaining, raw=True)
        except WorkerTimeout:
            raise RuntimeError(f"the course's {other} did not answer within the test's time "
                               f"limit of {self.time_limit_s:g} s (its time is this "
                               "test's)") from None
        except WorkerDied as exc:
            raise RuntimeError(f"the course's {other} stopped on these inputs: a limit "
                               f"(memory, CPU time) or a reply over "
                               f"{worker.reply_bytes >> 20} MiB [{exc}]") from None
        finally:
            # What the call is charged (a training's CPU time, a measured call's): the
            # answer's own CPU time as the reference worker timed it (the course's code
            # around the reference function), never more than the kernel counted for the
            # whole exchange; the whole exchange where there is no such figure. Not the
            # relay's framing, which an inline computation would not have: at ~2.5 ms an
            # exchange it was three quarters of what lab 8's training through lab 1 was
            # charged for the reference's work (ok_lab8_own_lab1: 16.6 CPU-s of 4.1).
            spent = None
            with contextlib.suppress(OSError, TypeError):
                spent = usage.reading(worker.pid).cpu_ns - before
            told = reply.get("cpu_ns") if isinstance(reply, dict) else None
            if type(told) is int and told >= 0 and spent is not None:
                spent = min(spent, told)
            spent = max(0, spent or 0)
            self.reference_cpu_ns += spent
            self.last_answer_cpu_ns = spent
            if self.measuring is not None:
                self.measuring.spent(spent)
        if not isinstance(reply, dict):
            worker.kill()
            raise RuntimeError(f"the course's {other} sent a malformed reply")
        used = reply.get("forbidden")
        if isinstance(used, list) and used:
            raise ValueError(f"{lab} may not use {', '.join(sorted(map(str, used)))[:300]}, "
                             f"not even through {other}")
        error = reply.get("error")
        if isinstance(error, dict):
            raise ValueError(f"the course's {other}.{req['call']['target']} raised "
                             f"{_text(error.get('type'), 200)}: {_text(error.get('message'), 500)}")
        if "ok" not in reply:
            worker.kill()
            raise RuntimeError(f"the course's {other} sent a malformed reply")
        if kept is None:
            return reply["ok"]
        value = kept.part("ok")
        if value is None:                   # tensors outside its value: not relayed
            worker.kill()
            raise RuntimeError(f"the course's {other} sent a malformed reply")
        self.relayed_bytes += len(value.payload)
        return value

    def _end_reference_workers(self) -> None:
        for worker in self.reference_workers.values():
            worker.kill()
        self.reference_workers.clear()

    def _reference_folder(self, lab: str) -> str:
        """A private folder holding the course's reference file of ``lab`` alone, made once
        per session: a worker serving it runs the reference in the same conditions as the
        student's code (a resource test's yardstick, ``measure(reference=True)``)."""
        if lab not in self.references:
            with open(f"{self.solutions}/{lab}.py", "rb") as fh:
                source = fh.read()
            self.references[lab] = make_scratch({f"{lab}.py": source})
        return self.references[lab].name


def _largest_number(value, depth: int = 0) -> float:
    """The largest |x| of the numbers in ``value`` that may size work: Python numbers (not
    bools), every value of an integer tensor (a length, a position, a count passed as
    ``torch.tensor(n)``: ``range`` and ``torch.arange`` take it as they take ``n``), and the
    value of a one-element floating tensor (``torch.arange(torch.tensor(5e6))`` works too).
    NaN counts as nothing; an infinity as the largest number."""
    if depth > 16:
        return 0.0
    if isinstance(value, bool):
        return 0.0
    if isinstance(value, (int, float)):
        return float(min(abs(value), 10**300)) if value == value else 0.0
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.numel() == 0:
            return 0.0
        if value.is_floating_point() or value.is_complex():
            if value.numel() != 1:
                return 0.0          # data (queries, weights), not a size
            x = abs(complex(value.detach().reshape(()).item()))
            return float(min(x, 10**300)) if x == x else 0.0
        t = value.detach()
        # Python ints (no overflow at -2**63), no copy of the tensor.
        return float(max(abs(int(t.max().item())), abs(int(t.min().item()))))
    if isinstance(value, (list, tuple)):
        return max((_largest_number(v, depth + 1) for v in value), default=0.0)
    if isinstance(value, dict):
        return max((_largest_number(v, depth + 1) for v in value.values()), default=0.0)
    return 0.0
