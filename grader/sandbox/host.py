"""The trusted side of the sandbox: start a zygote, get workers, talk to them with deadlines.

The zygote is a separate interpreter (``zygote.py``) started with an empty environment, so
nothing the grader holds (rubric, suites, references, secrets in the environment) is in its
memory. Workers are forked from it; the grader talks to each over its own socket, enforces
the wall-clock limit of every call, and kills the worker's whole PID namespace (or session)
when it is out of time or misbehaves.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from grader.errors import SandboxError
from grader.sandbox import protocol, wire
from grader.sandbox.jail import children_of
from grader.secret import secret_path

ZYGOTE = Path(__file__).with_name("zygote.py")
SLOT_UID_BASE = 61000   # root mode: slot n runs as uid 61000 + n
START_TIMEOUT_S = 60.0


class WorkerTimeout(Exception):
    """A call ran past its wall-clock limit; the worker was killed."""


class WorkerDied(Exception):
    """The worker exited or broke the protocol during a call; it was killed."""


@dataclass
class Limits:
    """Per-worker resource limits (a worker serves one lab of one submission).

    ``memory_mb`` and ``cpu_s`` hold per process: without cgroups, the worst case for the
    machine is ``processes`` times ``memory_mb`` (see docs/security.md).
    """
    cpu_s: int = 120
    memory_mb: int = 1024      # on top of what the torch-loaded zygote already maps
    file_mb: int = 16
    tmp_mb: int = 32
    open_files: int = 64
    processes: int = 16        # tasks (threads count) of the worker's uid / namespace
    reply_mb: int = 64

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def read_only_paths() -> list[str]:
    """What a worker may see: system libraries, the interpreter and its site-packages."""
    candidates = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache",
                  sys.base_prefix, sys.prefix]
    candidates += [p for p in sys.path if "site-packages" in p or "dist-packages" in p]
    out: list[str] = []
    for p in candidates:
        # Top-level links (/lib -> usr/lib) are recreated as links; everything else is bound
        # by its real path, once, and not again inside a tree already bound.
        if not (os.path.islink(p) and p.count("/") == 1):
            p = os.path.realpath(p)
        if not os.path.lexists(p) or any(p == q or p.startswith(q + "/") for q in out):
            continue
        if p in ("/", "/tmp", "/dev", "/dev/shm", "/proc"):
            continue            # never the whole of a shared or private tree
        out = [q for q in out if not q.startswith(p + "/")] + [p]
    return sorted(out, key=lambda x: x.count("/"))


def hidden_paths(extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Secret paths to cover if they fall inside a bound tree: the grader package (with its
    hidden suites), the course's solutions, rubric and examples, and ``extra``."""
    from grader import paths

    out = []
    for p in [Path(__file__).resolve().parent.parent, paths.SOLUTIONS, paths.RUBRIC,
              paths.EXAMPLES, secret_path(), *extra]:
        real = str(Path(p).resolve())
        if real not in out and real != "/":
            out.append(real)
    return out


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
    alive: bool = True
    _last_pid: int = 0          # the newest pid seen at the last check (wrap detection)
    _clean_at: int | None = None  # the newest pid when a scan last found no children

    # Requests sent ahead (``send_ahead``) whose replies ``receive`` has not read yet, and
    # the bytes of them the socket has not taken yet.
    pending: int = 0
    _outbox: bytearray = field(default_factory=bytearray, repr=False)
    answered: int = 0           # replies read; the worker numbers each reply (its "seq")
    # Answers the worker's calls into other labs (protocol "Callbacks"): request -> value;
    # raises to refuse. None: this worker is provided no other lab.
    on_callback: Callable[[dict], object] | None = None

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
        self._outbox += frames
        self.pending += count
        self._pump()

    def receive(self, *, timeout_s: float):
        """The next reply, read within ``timeout_s`` seconds (kills the worker if not)."""
        if not self.alive:
            raise WorkerDied("the worker is no longer running")
        if self.pending <= 0:
            raise RuntimeError("no request is waiting for a reply")
        deadline = time.monotonic() + timeout_s
        try:
            # The whole reply must arrive by the deadline, however the worker trickles it,
            # and whatever it asks of other labs on the way (each answered at once).
            for _ in range(protocol.MAX_CALLBACKS + 1):
                header_len, payload_len = wire.PREFIX.unpack(
                    self._read(wire.PREFIX.size, deadline))
                if header_len > wire.MAX_HEADER_BYTES:
                    raise wire.WireError("frame header exceeds the caps")
                if payload_len > self.reply_bytes:
                    raise wire.WireError(f"reply carries more than {self.reply_bytes} bytes")
                header = bytes(self._read(header_len, deadline))
                frame = wire.decode(header, self._read(payload_len, deadline))
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
                    return frame
                self._outbox += wire.encode({"callback_reply": self._callback(frame)})
                self._pump()
            raise wire.WireError(f"more than {protocol.MAX_CALLBACKS} callbacks in one reply")
        except socket.timeout:
            self.kill()
            raise WorkerTimeout() from None
        except Exception as exc:  # noqa: BLE001 - whatever an untrusted peer sent: it ends
            # (wire.WireError, OSError, or anything else reading the frame raised)
            self.kill()
            raise WorkerDied(str(exc)) from None

    def _callback(self, frame: dict) -> dict:
        """The reply to a worker's call into another lab: {"ok": value} or {"error": why}."""
        if self.on_callback is None:
            return {"error": "no other lab is provided to this lab"}
        try:
            return {"ok": self.on_callback(frame["callback"])}
        except Exception as exc:  # noqa: BLE001 - refused or failed: the student's call raises
            return {"error": f"{type(exc).__name__}: {exc}"[:500]}

    def _pump(self) -> None:
        """Send what the socket takes now of the queued requests, without waiting."""
        while self._outbox:
            try:
                sent = self.sock.send(self._outbox)
            except (BlockingIOError, InterruptedError):
                return
            del self._outbox[:sent]

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

    def _wait(self, deadline: float) -> None:
        """Until the socket is readable (or the deadline passes), feeding the worker."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("deadline passed while reading a reply")
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | (select.POLLOUT if self._outbox else 0))
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
    except (OSError, ValueError):
        return None


@dataclass
class Zygote:
    """A torch-loaded zygote process; ``spawn`` forks a locked-down worker from it."""
    forbidden: tuple[str, ...] = ()
    slot: int = 0
    mode: str = "auto"
    limits: Limits = field(default_factory=Limits)
    hide: tuple[str, ...] = ()
    pid: int | None = None
    landlock: int = 0           # the kernel's Landlock ABI (used in plain mode), 0 if none
    warm_up: str = ""           # "ok", or why the zygote's warm-up failed (workers run colder)
    _proc: subprocess.Popen | None = None
    _control: socket.socket | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> "Zygote":
        if self.mode == "auto":
            # GRADER_SANDBOX_MODE=root|userns|plain forces a mode (tests, odd platforms).
            forced = os.environ.get("GRADER_SANDBOX_MODE", "auto")
            self.mode = forced if forced in ("root", "userns", "plain") else "auto"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        os.set_inheritable(theirs.fileno(), True)
        # Empty environment and cwd "/": the zygote inherits no secrets (argv: the fd only).
        self._proc = subprocess.Popen(
            [sys.executable, "-I", str(ZYGOTE), str(theirs.fileno())],
            env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            # GRADER_SANDBOX_DEBUG=1 shows the zygote's and workers' own failures.
            stderr=None if os.environ.get("GRADER_SANDBOX_DEBUG") else subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self._control = ours
        probe_dir = tempfile.mkdtemp(prefix="grader-probe-")
        os.chmod(probe_dir, 0o755)
        try:
            ours.send(json.dumps({
                "mode": self.mode, "forbidden": list(self.forbidden),
                "probe": {"submission": probe_dir, "read_only_paths": read_only_paths(),
                          "uid": SLOT_UID_BASE + self.slot},
            }).encode())
            ours.settimeout(START_TIMEOUT_S)
            try:
                hello = json.loads(ours.recv(1 << 16) or b"{}")
            except (OSError, ValueError):
                hello = {}
        finally:
            os.rmdir(probe_dir)
        if not hello.get("ready"):
            self.close()
            raise SandboxError("the sandbox zygote did not start (is torch installed?)")
        self.mode = hello["mode"]
        self.pid = int(hello["pid"])
        self.landlock = int(hello.get("landlock", 0))
        self.warm_up = str(hello.get("warm_up", ""))
        ours.settimeout(None)
        return self

    @property
    def alive(self) -> bool:
        """Whether the zygote is running: False before ``start``, after ``close``, and once
        it has ended for any reason (then every worker it would fork is lost)."""
        return self._proc is not None and self._proc.poll() is None

    def spawn(self, *, submission: str, lab: str, forbidden: list[str],
              provided: dict[str, list[str]] | None = None) -> Worker:
        """A fresh worker for ``lab`` whose only files are those in ``submission``.

        ``provided``: other lab -> names that the worker's imports of that lab get as
        proxies answered through ``Worker.on_callback`` (protocol "Callbacks")."""
        if self._control is None:
            self.start()
        if not self.alive:
            # Not the student's doing: whoever asked for the worker must not score it.
            raise SandboxError("the sandbox zygote has stopped (exit status "
                               f"{self._proc.returncode if self._proc else None})")
        try:
            zygote_group = os.getpgid(self.pid) if self.pid else 0
        except ProcessLookupError:
            raise SandboxError("the sandbox zygote has stopped") from None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        config = {
            "submission": submission,
            "lab": lab,
            "forbidden": list(forbidden),
            # As root, every mode runs the worker as the slot's own uid.
            "uid": SLOT_UID_BASE + self.slot if os.geteuid() == 0 else None,
            "read_only_paths": read_only_paths(),
            "hide_paths": hidden_paths(self.hide),
            "limits": self.limits.to_dict(),
            "provided": {str(k): list(v) for k, v in (provided or {}).items()},
            # Plain mode: processes a worker may never signal (with their groups).
            "protected_pids": sorted({os.getpid(), os.getpgrp(), self.pid or 0,
                                      zygote_group} - {0}),
            "debug": bool(os.environ.get("GRADER_SANDBOX_DEBUG")),
        }
        with self._lock:
            try:
                socket.send_fds(self._control,
                                [json.dumps({"op": "spawn", "config": config}).encode()],
                                [theirs.fileno()])
                self._control.settimeout(START_TIMEOUT_S)
                msg, fds, _, _ = socket.recv_fds(self._control, 1 << 16, 1)
                reply = json.loads(msg or b"{}")
            except (OSError, ValueError) as exc:
                raise SandboxError(f"the sandbox zygote stopped answering: {exc}") from None
            finally:
                theirs.close()
        if "pid" not in reply or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            ours.close()
            raise SandboxError(f"could not start a worker: {reply.get('error', 'no reply')}")
        os.set_inheritable(fds[0], False)
        return Worker(pid=int(reply["pid"]), sock=ours, mode=self.mode,
                      reply_bytes=self.limits.reply_mb << 20, lifeline=fds[0],
                      keeper=reply.get("keeper"))

    def close(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            self._proc.wait()
            self._proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


def make_scratch(files: dict[str, bytes]) -> tempfile.TemporaryDirectory:
    """A private folder holding copies of the submission's lab files, readable by workers."""
    scratch = tempfile.TemporaryDirectory(prefix="grader-sub-")
    os.chmod(scratch.name, 0o755)
    for name, data in files.items():
        path = os.path.join(scratch.name, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(path, 0o644)
    return scratch
