"""The grader's end of a worker's channel: requests out, replies in, every wait bounded.

A ``Worker`` is what ``Zygote.spawn`` (``host``) returns: one live, locked-down worker
process reached over its own socket. The grader enforces the wall-clock limit of every
call here, reads each reply frame by frame under the wire's caps, answers the worker's
calls into other labs, and kills the worker's whole PID namespace (or session) when it is
out of time or misbehaves.

Kept apart from ``host`` because the wire (``wire``, ``protocol``) needs torch: ``host``
stays standard-library only, so a grader can launch its zygote before importing torch
itself (``Zygote.launch``; both processes then import it at once).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import os
import select
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Callable

from grader.sandbox import usage, wire
from grader.sandbox.jail import children_of


class WorkerTimeout(Exception):
    """A call ran past its wall-clock limit; the worker was killed."""


class WorkerDied(Exception):
    """The worker exited or broke the protocol during a call; it was killed."""


class EndWorker(Exception):
    """Raised by ``Worker.on_callback`` for a call that must not be answered at all: the
    worker is killed and its request fails (``WorkerDied``, with this message)."""



LOAD_STRETCH_MAX = 3.0    # a limit stretched by load to at most 4x its wall time


@dataclass
class Answer:
    """What ``Worker.on_callback`` may return: the value (or a ``wire.Raw`` of it) and the
    CPU time (ns) another process spent computing it, which the reply tells the worker (its
    clock counts it: the grader charges it to the worker's test)."""
    value: object
    cpu_ns: int = 0
    framing_ns: int = 0     # taken off the worker's own CPU time for framing the call


@dataclass
class Worker:
    """One live worker process, reached over ``sock``.

    ``lifeline`` is the write end of a pipe whose read end the worker's keeper (its trusted
    parent, see zygote.py) waits on: while the grader holds it, the worker's pid cannot be
    reaped and reused, so signalling ``pid`` is safe; closing it makes the keeper kill the
    worker and everything below it.
    """
    pid: int
    sock: socket.socket
    mode: str
    reply_bytes: int
    lifeline: int | None = None
    keeper: int | None = None
    # The portable backend's worker (``grader.sandbox.portable``): a process of its own,
    # started by the grader, ended by killing it (no keeper, no lifeline).
    process: object = None
    alive: bool = True
    _last_pid: int = 0          # the newest pid seen at the last check (wrap detection)
    _clean_at: int | None = None  # the newest pid when a scan last found no children

    # Requests sent ahead (``send_ahead``) whose replies ``receive`` has not read yet, and
    # the bytes of them the socket has not taken yet.
    pending: int = 0
    # Chunks to send, in order (frames, or a relayed reply's header and its payload buffer,
    # never copied into one).
    _outbox: collections.deque = field(default_factory=collections.deque, repr=False)
    # A reply to a call into another lab is in ``_outbox``: no frame is read from the
    # worker until it has all gone (a worker that asks without reading its answers holds
    # one of them here, never more).
    _relaying: bool = False
    answered: int = 0           # replies read; the worker numbers each reply (its "seq")
    # Answers the worker's calls into other labs (protocol "Callbacks"): (request, the
    # frame as a ``wire.Raw``) -> the value, or a ``wire.Raw`` of it to relay as it is, or
    # an ``Answer`` of either; raises to refuse. None: this worker is provided no other lab.
    on_callback: Callable[[dict, wire.Raw], object] | None = None
    # A reply's wall-clock limit follows the CPU the machine gave the worker: the time its
    # threads waited, runnable, for a CPU (load) is added to the deadline, up to
    # LOAD_STRETCH_MAX times the limit; only the worker's own time can run it out.
    _granted_s: float = 0.0
    _delay_at: int = 0
    _stretch_cap_s: float = 0.0
    # What the last reply waited for a CPU (seconds), for the caller's later deadlines.
    load_delay_s: float = 0.0

    def __post_init__(self):
        # All I/O is non-blocking and waits in ``_wait``, which also feeds the worker the
        # requests it has not read yet while the grader waits for a reply.
        self.sock.setblocking(False)

    def request(self, req: dict, *, timeout_s: float):
        """Send one request and wait for its reply, at most ``timeout_s`` seconds."""
        if self.pending:
            raise RuntimeError("requests sent ahead are still unanswered")
        self.send_ahead(wire.encode(req), count=1)
        return self.receive(timeout_s=timeout_s)

    def send_ahead(self, frames: bytes, *, count: int) -> None:
        """Queue ``count`` request frames; the worker answers them in order (``receive``).

        The socket takes what it can now; the rest goes while ``receive`` waits, so a
        worker with a queue of requests works through them without waiting for the grader.
        """
        if not self.alive:
            raise WorkerDied("the worker is no longer running")
        self._queue(frames)
        self.pending += count
        self._pump()

    def send_parts_ahead(self, chunks: list, *, count: int) -> None:
        """``send_ahead`` for a frame given as chunks (``wire.parts``), not copied."""
        if not self.alive:
            raise WorkerDied("the worker is no longer running")
        for chunk in chunks:
            self._queue(chunk)
        self.pending += count
        self._pump()

    def _queue_reply(self, answer, told: dict) -> None:
        if isinstance(answer, wire.Raw):
            chunks = wire.parts({"callback_reply": {"ok": answer.tree, **told}},
                                answer.payload)
        else:
            chunks = [wire.encode({"callback_reply": {**answer, **told}})]
        for chunk in chunks:
            self._queue(chunk)

    def _queue(self, chunk) -> None:
        if len(chunk):
            self._outbox.append(memoryview(chunk).cast("B"))

    def receive(self, *, timeout_s: float, raw: bool = False):
        """The next reply, read within ``timeout_s`` seconds (kills the worker if not);
        ``raw``: (the reply, the reply as a ``wire.Raw``)."""
        if not self.alive:
            raise WorkerDied("the worker is no longer running")
        if self.pending <= 0:
            raise RuntimeError("no request is waiting for a reply")
        deadline = time.monotonic() + timeout_s
        self._granted_s, self._delay_at = 0.0, usage.run_delay_ns(self.pid)
        self._stretch_cap_s = LOAD_STRETCH_MAX * timeout_s
        try:
            # The whole reply must arrive by the deadline, however the worker trickles it,
            # and whatever it asks of other labs on the way (each answered at once).
            while True:     # no count of callbacks: each is bounded by this deadline
                if self._relaying:
                    self._drain(deadline)
                header_len, payload_len = wire.PREFIX.unpack(
                    self._read(wire.PREFIX.size, deadline))
                if header_len > wire.MAX_HEADER_BYTES:
                    raise wire.WireError("frame header exceeds the caps")
                if payload_len > self.reply_bytes:
                    raise wire.WireError(f"reply carries more than {self.reply_bytes} bytes")
                header = bytes(self._read(header_len, deadline))
                frame, kept = wire.decode_raw(header, self._read(payload_len, deadline))
                del header
                if not (isinstance(frame, dict) and "callback" in frame):
                    # A frame that is not the reply to the oldest request (student code
                    # wrote to the channel) ends the worker: no reply is ever matched to
                    # the wrong request.
                    if not (isinstance(frame, dict) and frame.get("seq") == self.answered + 1
                            and type(frame.get("seq")) is int):
                        raise wire.WireError("a frame out of turn: the code under test wrote "
                                             "to the grader's channel")
                    self.answered += 1
                    self.pending -= 1
                    self.load_delay_s = max(
                        0.0, (usage.run_delay_ns(self.pid) - self._delay_at) / 1e9)
                    return (frame, kept) if raw else frame
                answer, told = self._callback(frame, kept)
                del frame, kept             # the request's buffer goes before the reply's
                # No local of this frame keeps the reply's buffer: a traceback of a later
                # timeout here (kept for the test's report) would hold it until the cyclic
                # garbage collector ran.
                self._queue_reply(answer, told)
                del answer
                self._relaying = True
                self._pump()
        except socket.timeout:
            self.kill()
            raise WorkerTimeout() from None
        except Exception as exc:  # noqa: BLE001 - whatever an untrusted peer sent: it ends
            # (wire.WireError, OSError, or anything else reading the frame raised)
            self.kill()
            raise WorkerDied(str(exc)) from None

    def _callback(self, frame: dict, kept: wire.Raw) -> tuple[object, dict]:
        """The reply to a worker's call into another lab: {"ok": value} or {"error": why},
        or a ``wire.Raw`` of the value (relayed as it came from a reference worker); and
        what the reply tells the worker's clock (``Answer``): {"cpu_ns": the CPU time the
        answer took elsewhere, "framing_ns": what is taken off its own}."""
        told = {"cpu_ns": 0, "framing_ns": 0}
        if self.on_callback is None:
            return {"error": "no other lab is provided to this lab"}, told
        try:
            value = self.on_callback(frame["callback"], kept.part("callback"))
        except EndWorker:
            raise                   # ``receive`` kills the worker
        except Exception as exc:  # noqa: BLE001 - refused or failed: the student's call raises
            return {"error": f"{type(exc).__name__}: {exc}"[:500]}, told
        if isinstance(value, Answer):
            told = {"cpu_ns": max(0, int(value.cpu_ns)),
                    "framing_ns": max(0, int(value.framing_ns))}
            value = value.value
        return (value if isinstance(value, wire.Raw) else {"ok": value}), told

    def _pump(self) -> None:
        """Send what the socket takes now of the queued chunks, without waiting."""
        while self._outbox:
            head = self._outbox[0]
            try:
                sent = self.sock.send(head)
            except (BlockingIOError, InterruptedError):
                return
            if sent >= len(head):
                self._outbox.popleft()      # its buffer (a relayed reply) is freed now
            else:
                self._outbox[0] = head[sent:]
        self._relaying = False

    def _drain(self, deadline: float) -> None:
        """Wait (within ``deadline``) until every queued chunk is sent: a reply to a call
        into another lab is read by the worker before it may send another frame."""
        self._pump()
        while self._outbox:
            self._wait(deadline, read=False)
            self._pump()

    def _read(self, n: int, deadline: float) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            try:
                size = self.sock.recv_into(view[got:], n - got)
            except (BlockingIOError, InterruptedError):
                self._wait(deadline)
                continue
            if not size:
                raise wire.PeerClosed("channel closed")
            got += size
        return buf

    def _wait(self, deadline: float, *, read: bool = True) -> None:
        """Until the socket is readable (or the deadline passes), feeding the worker;
        ``read=False``: until it takes more of what is queued."""
        remaining = deadline + self._granted_s - time.monotonic()
        if remaining <= 0:
            waited = (usage.run_delay_ns(self.pid) - self._delay_at) / 1e9
            self._granted_s = min(self._stretch_cap_s, max(self._granted_s, waited))
            remaining = deadline + self._granted_s - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("deadline passed while reading a reply")
        if not hasattr(select, "poll"):     # Windows: select() takes sockets there
            readable, writable, _ = select.select([self.sock] if read else [],
                                                  [self.sock] if self._outbox else [], [],
                                                  max(0.001, remaining))
            if writable:
                self._pump()
            return
        poller = select.poll()
        poller.register(self.sock, (select.POLLIN if read else 0)
                        | (select.POLLOUT if self._outbox else 0))
        for _fd, events in poller.poll(max(1, math.ceil(remaining * 1000))):
            if events & select.POLLOUT:
                self._pump()

    def has_children(self) -> bool:
        """Whether anything the student started is still alive.

        The worker is pid 1 of its PID namespace (root, userns) or a child subreaper
        (plain), so every live process it started is its child or below a live child.
        """
        if not self.alive:
            return False
        last = _last_pid()
        # No process was created anywhere since a scan found none: there is still none,
        # and the scan of /proc (the costly part, run before every test) is skipped.
        if last is not None and last == self._clean_at:
            return False
        # Pids grow until they wrap at pid_max, so a child of the worker has a larger pid
        # than the worker unless the counter wrapped since: then every process is looked at.
        wrapped = last is None or last < max(self._last_pid, self.pid)
        self._last_pid = last or 0
        found = bool(children_of(self.pid, above=None if wrapped else self.pid))
        # ``last`` was read before the scan: a child born during it moves the counter on.
        self._clean_at = None if found else last
        return found

    def kill(self) -> None:
        """End the worker and everything it started (its PID namespace, or its session)."""
        if not self.alive:
            return
        self.alive = False
        # Nothing more is sent: what was queued (a relayed reply's buffer) goes now, even
        # while a traceback kept for the test's report still refers to this Worker.
        self._outbox.clear()
        self._relaying = False
        if self.process is not None:
            self.process.kill_tree()
            with contextlib.suppress(OSError):
                self.sock.close()
            return
        for target in (lambda: os.kill(self.pid, signal.SIGKILL),
                       lambda: os.killpg(self.pid, signal.SIGKILL)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                target()
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.lifeline is not None:
            os.close(self.lifeline)
            self.lifeline = None


@functools.cache
def _last_pid_fd() -> int:
    # Kept open: it is read before every test, and pread needs no seek.
    return os.open("/proc/sys/kernel/ns_last_pid", os.O_RDONLY | os.O_CLOEXEC)


def _last_pid() -> int | None:
    """The pid most recently given out in this PID namespace (None where unreadable)."""
    try:
        return int(os.pread(_last_pid_fd(), 32, 0))
    except (OSError, ValueError, AttributeError):     # no /proc, or no os.pread (Windows)
        return None
