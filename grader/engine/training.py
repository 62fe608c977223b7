"""Lab 8's training: one train request per submission in a fresh worker, its CPU time read
from outside (the lab's import included, the reference's answers to its calls into other
labs added, the relay's framing taken off)."""

from __future__ import annotations

import functools
from dataclasses import replace


from grader.sandbox import (usage, wire)
from grader.sandbox.usage import Measured
from grader.engine.failures import (RecordedCall,
                                     StudentError)


class Training:
    """``Session``'s part that runs a lab's training once and shares it between tests."""

    def train(self, lab: str, req: dict) -> tuple[object, Measured]:
        """A train request (protocol "train"), answered once per submission: the first test
        that asks runs it in a fresh worker of its own, its CPU time read from the kernel's
        accounting (the lab's import included); later tests get
        the same reply, or the same error. Recorded in every test that asks."""
        key = (lab, wire.encode(req))
        if key not in self.trained:
            self.trained[key] = self._train_once(lab, req)
        got = self.trained[key]
        if isinstance(got, StudentError):
            self._record(RecordedCall(lab, req, error=got))
            raise got
        value, used = got
        self._record(RecordedCall(lab, req, value=value, used=used))
        return value, used

    def _train_once(self, lab: str, req: dict):
        """(value, Measured) of ``req`` in a fresh worker, or the StudentError it gave.
        Not ``measure``: that one maps every large allocation on its own for an exact
        memory peak, which slows a training loop, and a training is timed, not weighed."""
        worker = None
        self.end_student_workers()
        try:
            # Known before the training starts: each reply tells the worker's clock what
            # moving the call's bytes is taken off (``_answer``).
            rate = self._framing_rate(lab) if self._relays(lab) else None
            worker = self._spawn(lab)
            if rate is not None:
                worker.on_callback = functools.partial(self._answer, lab, rate=rate)
            # The import counts: work done at import time (a model trained there) is the
            # training's too.
            before = self._cpu_reading(worker, final=False)
            self.reference_cpu_ns = 0
            moved = self.moved.copy()
            value = self._exchange(worker, lab, req)
            after = self._cpu_reading(worker, final=True)
            used = usage.measured(before, after, children_alive=worker.has_children())
            # What the course's reference computed for it (its lab 1's attention, say) is
            # the training's CPU time too: added here, each answer's own as the reference
            # worker timed it (``_reference_answer``; the student's worker sleeps while a
            # call is answered, and its clock counts the answers: ``Server.callback``).
            # Moving the calls' bytes is the relay's, taken off (``relay_cost``).
            relay_s = self._framing_s(lab, self.moved.since(moved), used.cpu_s)
            return value, replace(
                used, cpu_s=used.cpu_s - relay_s + self.reference_cpu_ns / 1e9,
                relay_s=relay_s)
        except StudentError as exc:
            return exc
        except OSError as exc:          # the worker's /proc went away: it is gone
            return StudentError(kind="crash", lab=lab,
                                message=f"the worker ended before it could be measured ({exc})")
        finally:
            if worker is not None:
                worker.kill()
