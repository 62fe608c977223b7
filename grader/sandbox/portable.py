"""The portable backend: workers as fresh interpreters, reached over a loopback socket.

For a student's own ``grader check`` where the Linux jail cannot run (Windows, macOS, a
Linux without what the jail needs) or where ``GRADER_SANDBOX_MODE=portable`` forces it
(``grader.sandbox.backends`` says what each backend gives). ``PortableZygote`` has the
interface of ``host.Zygote`` (``launch``, ``start``, ``spawn`` -> ``channel.Worker``,
``close``), so the engine does not know which one it holds.

No fork: each worker is ``python -I portable_worker.py`` started by ``subprocess`` (spawn,
the one way every platform has). One spare worker is always started ahead, importing torch
while the previous one serves, so a worker after a crash or a time-out is ready in
milliseconds, not the seconds torch's import takes. A worker connects to a listening socket
on 127.0.0.1 that only this process knows the port of, and proves itself with a one-time
token, so no other local process can pose as it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from grader.errors import SandboxError
from grader.sandbox.host import Limits

WORKER = Path(__file__).with_name("portable_worker.py")
START_TIMEOUT_S = 60.0
TOKEN_BYTES = 32
CPU_DIGITS = 20             # the worker's CPU time at connection, in ns, after its token
KILL_TREE_S = 3.0           # at most this long ending what a worker started, round by round


class WorkerProcess:
    """One portable worker's process and private temporary folder: ``kill_tree`` ends both."""

    def __init__(self, *, debug: bool):
        self.tmp = tempfile.mkdtemp(prefix="grader-portable-")
        env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "TMPDIR": self.tmp, "TEMP": self.tmp, "TMP": self.tmp}
        # Windows cannot open a socket without SYSTEMROOT; nothing secret is in it.
        env.update({k: os.environ[k] for k in ("SYSTEMROOT", "windir") if k in os.environ})
        options = {"start_new_session": True} if hasattr(os, "setsid") else {
            "creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
        self.popen = subprocess.Popen(
            [sys.executable, "-I", str(WORKER)], env=env, cwd=self.tmp,
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=None if debug else subprocess.DEVNULL, **options)
        self.pid = self.popen.pid
        self.ended = False
        self.start_cpu_ns = 0       # its CPU time when it connected (torch's import)
        self.end_cpu_ns: int | None = None

    def cpu_ns(self, *, final: bool) -> int | None:
        """The process's CPU time (ns, user + system) from the OS, for a training's budget
        where /proc is absent. ``final``: the training is over; the process is ended and its
        total read (rusage of a reaped child, or GetProcessTimes on Windows). Not final: its
        CPU time when it connected, before any student code ran."""
        if not final:
            return self.start_cpu_ns
        if self.end_cpu_ns is None:
            self.end_cpu_ns = self._final_cpu_ns()
        return self.end_cpu_ns

    def _final_cpu_ns(self) -> int | None:
        handle = getattr(self.popen, "_handle", None)
        if handle is not None:                      # Windows
            import ctypes
            times = [ctypes.c_ulonglong() for _ in range(4)]
            ok = ctypes.windll.kernel32.GetProcessTimes(
                int(handle), *[ctypes.byref(t) for t in times])
            return (times[2].value + times[3].value) * 100 if ok else None
        if not hasattr(os, "wait4") or self.ended:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        try:
            _, status, rusage = os.wait4(self.pid, 0)
        except (ChildProcessError, ImportError):     # ImportError: no resource module
            return None
        self.popen.returncode = -signal.SIGKILL
        return int((rusage.ru_utime + rusage.ru_stime) * 1e9)

    def give_config(self, config: dict) -> None:
        self.popen.stdin.write(json.dumps(config).encode() + b"\n")
        self.popen.stdin.close()

    def kill_tree(self) -> None:
        """The worker and whatever it started: every descendant /proc shows (the worker is
        their subreaper on Linux, so a detached one is among them), its session, and it."""
        if self.ended:
            return
        self.ended = True
        # The worker stopped first, so that it starts nothing more (it may be importing the
        # lab, forking, as it is ended); then until a scan finds no live descendant: a
        # process killed as it forks leaves a child that is handed to the worker (the
        # subreaper) only once the killed one has exited, so each round waits for its
        # processes to be dead before looking again. The worker goes last: while it lives,
        # what it started is below it.
        if hasattr(signal, "SIGSTOP"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGSTOP)
        deadline = time.monotonic() + KILL_TREE_S
        while _state(self.pid) not in (b"T", b"t", b"Z", b"") and time.monotonic() < deadline:
            time.sleep(0.001)                   # a signal is delivered, not yet taken
        quiet = 0
        while time.monotonic() < deadline:
            live = [pid for pid in _descendants(self.pid) if _running(pid)]
            if not live:
                # Twice, a moment apart: a scan that reads a child's parent just before that
                # parent exits finds neither (the parent a zombie, the child not yet the
                # worker's).
                quiet += 1
                if quiet == 2:
                    break
                time.sleep(0.01)
                continue
            quiet = 0
            for pid in live:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            while any(_running(pid) for pid in live) and time.monotonic() < deadline:
                time.sleep(0.002)
        if hasattr(os, "killpg"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        elif shutil.which("taskkill"):          # Windows: the process and its children
            subprocess.run(["taskkill", "/T", "/F", "/PID", str(self.pid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        with contextlib.suppress(OSError):
            self.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        with contextlib.suppress(OSError, ValueError):
            self.popen.stdin.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _state(pid: int) -> bytes:
    """``pid``'s state letter in /proc (b"" where it is gone, or there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return b""


def _running(pid: int) -> bool:
    """``pid`` exists and has not exited (a zombie has: its children are reparented)."""
    return _state(pid) not in (b"", b"Z")


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (empty without /proc: macOS, Windows, where a process the
    student's code detaches can outlive the check; docs/security.md says so)."""
    from grader.sandbox.jail import children_of
    found, todo = [], [pid]
    while todo and len(found) < 4096:
        below = children_of(todo.pop())
        found += below
        todo += below
    return found


@dataclass
class PortableZygote:
    """``host.Zygote``'s interface on the portable backend (``grader.sandbox.backends``)."""
    forbidden: tuple[str, ...] = ()
    slot: int = 0
    mode: str = "portable"
    limits: Limits = field(default_factory=Limits)
    hide: tuple[str, ...] = ()
    many_workers: bool = True
    pid: int | None = None          # the listening process's own (no zygote process)
    landlock: int = 0
    warm_up: str = "none: the portable backend has no zygote"
    huge_page_regions: int = 0
    timings: dict = field(default_factory=dict)
    _listener: socket.socket | None = None
    _spare: WorkerProcess | None = None
    _started: list = field(default_factory=list)    # every WorkerProcess not yet ended

    def launch(self) -> "PortableZygote":
        """Open the loopback listener and start the spare worker (nothing is waited for)."""
        if self._listener is None:
            self.mode = "portable"
            self._listener = socket.create_server(("127.0.0.1", 0), backlog=16)
            self.pid = os.getpid()
        if self._spare is None:
            self._spare = self._start_process()
        return self

    def start(self) -> "PortableZygote":
        return self.launch()

    @property
    def alive(self) -> bool:
        return self._listener is not None

    def _start_process(self) -> WorkerProcess:
        try:
            process = WorkerProcess(debug=bool(os.environ.get("GRADER_SANDBOX_DEBUG")))
        except OSError as exc:
            raise SandboxError(f"could not start a portable worker: {exc}") from None
        self._started = [p for p in self._started if not p.ended] + [process]
        return process

    def spawn(self, *, submission: str, lab: str, forbidden: list[str],
              importable: dict[str, list[str]] | None = None, answered_by: str = "own"):
        """A worker for ``lab`` serving the files of ``submission`` (``host.Zygote.spawn``)."""
        self.launch()
        process, self._spare = self._spare, None
        token = secrets.token_hex(TOKEN_BYTES // 2)
        config = {
            "submission": submission, "lab": lab, "forbidden": list(forbidden),
            "forbidden_everywhere": list(self.forbidden),
            "importable": {str(k): list(v) for k, v in (importable or {}).items()},
            "answered_by": answered_by, "limits": self.limits.to_dict(),
            "port": self._listener.getsockname()[1], "token": token,
        }
        try:
            process.give_config(config)
            sock = self._accept(token, process)
        except (OSError, SandboxError) as exc:
            process.kill_tree()
            raise SandboxError(f"could not start a portable worker: {exc}") from None
        finally:
            self._spare = self._start_process()     # the next one imports torch meanwhile
        from grader.sandbox.channel import Worker
        return Worker(pid=process.pid, sock=sock, mode="portable",
                      reply_bytes=self.limits.reply_mb << 20, process=process)

    def _accept(self, token: str, process: WorkerProcess) -> socket.socket:
        """The connection that presents ``token``; others are closed unread."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or process.popen.poll() is not None:
                raise SandboxError("the portable worker did not connect (is torch installed?)")
            self._listener.settimeout(min(remaining, 0.5))
            try:
                sock, _ = self._listener.accept()
            except socket.timeout:
                continue
            # A silent connection (a leftover process's) holds the wait a second at most.
            sock.settimeout(min(1.0, max(0.1, deadline - time.monotonic())))
            try:
                got = b""
                while len(got) < TOKEN_BYTES + CPU_DIGITS:
                    chunk = sock.recv(TOKEN_BYTES + CPU_DIGITS - len(got))
                    if not chunk:
                        break
                    got += chunk
            except OSError:
                got = b""
            if secrets.compare_digest(got[:TOKEN_BYTES], token.encode("ascii")) \
                    and got[TOKEN_BYTES:].isdigit():
                process.start_cpu_ns = int(got[TOKEN_BYTES:])
                sock.settimeout(None)
                return sock
            sock.close()

    def close(self) -> None:
        for process in self._started:
            process.kill_tree()
        self._started.clear()
        self._spare = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
