"""A session's workers: start one for a lab, send a call, read its reply within the test's
time, turn what came back (a value, an error, a dead or late worker) into a value or a
``StudentError``."""

from __future__ import annotations

import contextlib
import functools
import time


from grader.sandbox import (SandboxError, Worker, WorkerDied, WorkerTimeout, wire)
from grader.engine.failures import (StudentError, StudentTimeout, _error_from_reply, _text)


class WorkerLink:
    """``Session``'s part that talks to workers (one live worker per lab; see there)."""

    def _worker(self, lab: str) -> Worker:
        """The lab's live worker, or a new one."""
        worker = self.workers.get(lab)
        if worker is not None and worker.alive:
            return worker
        worker = self._spawn(lab)
        self.workers[lab] = worker
        return worker

    def _spawn(self, lab: str, *, reference: bool = False) -> Worker:
        """A new worker for ``lab`` (the caller keeps it, or kills it); ``reference``: one
        serving the course's reference file of the lab instead of the submission's (its
        own imports of earlier labs are the reference's too)."""
        importable = self.importable.get(lab) or {}
        by_reference = self._relays(lab)
        if reference:
            folder = self.reference_dir or self._reference_folder(lab)
        else:
            folder = self.submission_dir
        try:
            worker = self.zygote.spawn(submission=folder, lab=lab,
                                       forbidden=[] if reference
                                       else list(self.forbidden.get(lab, ())),
                                       importable=importable,
                                       answered_by="reference"
                                       if by_reference and not reference else "own")
        except SandboxError as exc:
            # Not the student's doing: the test in flight fails at once, and the Grader
            # turns the whole submission into a grader fault (``fault``), never a score.
            self.fault = self.fault or exc
            raise StudentError(kind="crash", message=f"the sandbox failed: {exc}",
                               lab=lab) from None
        if by_reference:
            worker.on_callback = functools.partial(self._answer, lab)
        self._watch(worker)
        return worker

    def _watch(self, worker: Worker) -> None:
        """The clock counts ``worker`` (and its keeper) until they are reaped."""
        if self.clock is not None:
            self.clock.watch(worker.pid, keeper=getattr(worker, "keeper", None))

    def _send(self, lab: str, req: dict):
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self._timeout(lab)
        frame = wire.encode(req)
        if self.recorder is not None:
            self.recorder.sent(lab, frame)
        worker = self.prefetch.take(self.test, lab, frame) if self.prefetch is not None else None
        sent = worker is not None
        worker = worker or self._worker(lab)
        self.made += 1
        with self._waiting(lab):
            if not sent:
                worker.send_ahead(frame, count=1)
            reply = worker.receive(timeout_s=remaining)
            self._credit_load(worker)
            if self.prefetch is not None:
                self.prefetch.answered(self.test, lab, self.made)
        return self._reply_value(worker, lab, reply)

    def _credit_load(self, worker: Worker) -> None:
        """The test's deadline moves by the time ``worker``'s last reply waited for a CPU."""
        extra = min(worker.load_delay_s, self.load_credit_s)
        self.deadline += extra
        self.load_credit_s -= extra

    @contextlib.contextmanager
    def _waiting(self, lab: str):
        """A worker's reply awaited: out of time is a timeout, a dead worker a crash."""
        try:
            yield
        except WorkerTimeout:
            raise self._timeout(lab) from None
        except WorkerDied as exc:
            raise StudentError(
                kind="crash", lab=lab,
                message="it exited or was killed before answering (os._exit, a signal, "
                        f"a segfault, or a resource limit: memory, CPU time, files) [{exc}]",
            ) from None

    def _reply_value(self, worker: Worker, lab: str, reply):
        """The value of a worker's reply, or the StudentError it stands for."""
        if not isinstance(reply, dict):
            worker.kill()
            raise StudentError(kind="crash", lab=lab, message="the worker sent a malformed reply")
        self.last_stdout = _text(reply.get("stdout"), 4000)
        used = reply.get("forbidden")
        error = reply.get("error")
        mro = error.get("mro") if isinstance(error, dict) else None
        if isinstance(used, list) and used and not (
                isinstance(mro, list) and "ForbiddenAPIError" in mro):
            # Reported even when student code caught the ForbiddenAPIError.
            # Named only from the rubric's list: the words are the grader's, shown whole.
            names = ", ".join(sorted({str(u) for u in used}
                                     & set(self.forbidden.get(lab, ())))) or \
                "an API of its forbidden list"
            error = StudentError(kind="forbidden", lab=lab, type_name="ForbiddenAPIError",
                                 mro=("ForbiddenAPIError",), stdout=self.last_stdout,
                                 message=f"{lab} may not use {names} (see the lab's rules)")
            error.grader_words = True
            raise error
        if "error" in reply and isinstance(reply["error"], dict):
            error = _error_from_reply(reply["error"], lab, self.last_stdout)
            error.note = self._imported_lab_note(lab, error.where)
            raise error
        if "ok" not in reply:
            worker.kill()
            raise StudentError(kind="crash", lab=lab, message="the worker sent a malformed reply")
        return reply["ok"]

    def _imported_lab_note(self, lab: str, where: str) -> str:
        """Where the submission's own earlier lab answered ``lab``'s imports but will not
        when graded (a kit without the reference): that a failure raised in that lab's file
        (``where``, "lab1_attention.py:30 in ...") comes from it."""
        other = where.split(".py:", 1)[0] if ".py:" in where else ""
        if (self.reference_dir is not None or self.imports_when_graded != "reference"
                or other not in (self.importable.get(lab) or {})):
            return ""
        return (f"This comes from your own {other}.py, which {lab} imports: without the "
                f"course's reference (this check) your {other} answers those calls; when "
                f"{lab} is graded it gets the course's {other}, and your {other}.py is "
                "graded on its own")

    def _exchange(self, worker: Worker, lab: str, req: dict | None = None, *,
                  frame: bytes | None = None):
        """One request (``req``, or its encoded ``frame``) to ``worker`` and its reply's
        value, within the test's time."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self._timeout(lab)
        self.made += 1
        with self._waiting(lab):
            worker.send_ahead(wire.encode(req) if frame is None else frame, count=1)
            reply = worker.receive(timeout_s=remaining)
            self._credit_load(worker)
        return self._reply_value(worker, lab, reply)

    def _timeout(self, lab: str) -> StudentTimeout:
        return StudentTimeout(
            kind="timeout", lab=lab,
            message=f"time limit of {self.time_limit_s:g} s exceeded (an infinite loop, or "
                    "work that grows too fast with the input size?)",
        )
