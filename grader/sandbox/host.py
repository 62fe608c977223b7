"""The trusted side of the sandbox: start a zygote, get workers from it.

The zygote is a separate interpreter (``zygote.py``) started with an empty environment, so
nothing the grader holds (rubric, suites, references, secrets in the environment) is in its
memory. Workers are forked from it; the grader talks to each over its own socket
(``channel.Worker``: deadlines on every call, the worker's whole PID namespace or session
killed when it is out of time or misbehaves).

This module uses the standard library only (no torch): a grader can ``Zygote.launch`` the
zygote first and import torch while the zygote imports its own (two processes, two cores),
then ``start`` waits for the zygote's hello. ``grader check`` saves ~1.5 s that way.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from grader.errors import SandboxError
from grader.sandbox.jail import MODES

if TYPE_CHECKING:     # channel needs torch (the wire): imported when a worker is spawned
    from grader.sandbox.channel import Worker

ZYGOTE = Path(__file__).with_name("zygote.py")
SLOT_UID_BASE = 61000   # root mode: slot n runs as uid 61000 + n
SLOTS = 1000            # slots a machine's zygotes choose from
START_TIMEOUT_S = 60.0


def claim_slot(preferred: int = 0) -> tuple[int, int]:
    """A sandbox slot that no other zygote on this machine holds: ``preferred`` if it is
    free, else the next free one. Returns (the slot, the fd of its lock: held until closed,
    and released by the kernel if this process dies). A slot is the workers' own uid as
    root, and RLIMIT_NPROC counts a uid's tasks over the whole machine: two graders with
    one slot (a TA's ``grader grade`` beside a batch) would share one task budget."""
    import fcntl       # here: the jail's (Linux) only; grader.sandbox.backends checks it

    folder = Path(tempfile.gettempdir())
    for slot in [*range(preferred, SLOTS), *range(0, min(preferred, SLOTS))]:
        try:
            fd = os.open(folder / f"grader-slot-{slot}.lock", os.O_RDWR | os.O_CREAT
                         | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            continue                    # another user's lock file
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return slot, fd
        except OSError:
            os.close(fd)
    raise SandboxError(f"no free sandbox slot on this machine ({SLOTS} zygotes alive?)")


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
    hidden suites) and ``extra`` (the course's solutions, rubric, examples and secret:
    ``Course.private_paths``, which the Grader passes as ``Zygote.hide``)."""
    out = []
    for p in [Path(__file__).resolve().parent.parent, *extra]:
        real = str(Path(p).resolve())
        if real not in out and real != "/":
            out.append(real)
    return out


@dataclass
class Zygote:
    """A torch-loaded zygote process; ``spawn`` forks a locked-down worker from it."""
    forbidden: tuple[str, ...] = ()
    # The slot asked for (a uid of its own as root); from ``launch`` the one held while the
    # zygote lives: this one, or the next free one if another zygote holds it (``claim_slot``).
    slot: int = 0
    mode: str = "auto"
    limits: Limits = field(default_factory=Limits)
    hide: tuple[str, ...] = ()
    # Many workers will be forked (a batch): the zygote collects its heap and backs it with
    # 2 MB pages, each fork and exit ~10 ms cheaper, for 0.2-1.5 s more at start. Not worth
    # it for one submission (``zygote.settle``).
    many_workers: bool = True
    pid: int | None = None
    landlock: int = 0           # the kernel's Landlock ABI (used in plain mode), 0 if none
    warm_up: str = ""           # "ok", or why the zygote's warm-up failed (workers run colder)
    huge_page_regions: int = 0  # memory regions the zygote collapsed into huge pages
    # Seconds from the zygote's start to the end of its imports, warm-up and heap settling.
    timings: dict = field(default_factory=dict)
    _proc: subprocess.Popen | None = None
    _control: socket.socket | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _probe_dir: str | None = None   # launched, its hello not read yet (``start``)
    _slot_lock: int | None = None   # the fd that holds ``slot`` while the zygote lives

    def launch(self) -> "Zygote":
        """Start the zygote's process and send its hello, without waiting for its answer.

        The zygote imports torch and warms up meanwhile; ``start`` (or the first ``spawn``)
        waits for it to be ready. Nothing here needs torch. A live zygote, or one already
        launched, is left as it is.
        """
        if self._probe_dir is not None or (self._control is not None and self.alive):
            return self
        self._drop_process()        # one that has ended: its socket and process go first
        if self._slot_lock is None:
            # ``slot`` is the one asked for; the zygote takes the next free one if another
            # zygote on this machine holds it (``claim_slot``).
            self.slot, self._slot_lock = claim_slot(self.slot)
        if self.mode not in ("auto", *MODES):
            raise SandboxError(f"no sandbox mode {self.mode!r}")
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
        # The mode probe's folder lives until the hello has come (``start``).
        self._probe_dir = tempfile.mkdtemp(prefix="grader-probe-")
        try:
            os.chmod(self._probe_dir, 0o755)
            # A datagram: queued in the socket until the zygote, its imports done, reads it.
            ours.send(json.dumps({
                "mode": self.mode, "forbidden": list(self.forbidden),
                "many_workers": bool(self.many_workers),
                "probe": {"submission": self._probe_dir, "read_only_paths": read_only_paths(),
                          "uid": SLOT_UID_BASE + self.slot},
            }).encode())
        except BaseException:
            self.close()
            raise
        return self

    def start(self) -> "Zygote":
        """Launch the zygote unless it was (``launch``), and wait until it is ready.
        SandboxError if it does not start."""
        if self._probe_dir is None and self._control is not None and self.alive:
            return self             # started already
        self.launch()
        ours = self._control
        try:
            ours.settimeout(START_TIMEOUT_S)
            try:
                hello = json.loads(ours.recv(1 << 16) or b"{}")
            except (OSError, ValueError):
                hello = {}
        finally:
            self._remove_probe_dir()
        if not hello.get("ready"):
            self.close()
            raise SandboxError("the sandbox zygote did not start (is torch installed?)")
        self.mode = hello["mode"]
        self.pid = int(hello["pid"])
        self.landlock = int(hello.get("landlock", 0))
        self.warm_up = str(hello.get("warm_up", ""))
        self.huge_page_regions = int(hello.get("huge_page_regions", 0))
        timings = hello.get("timings")
        self.timings = {str(k): float(v) for k, v in timings.items()
                        if isinstance(v, (int, float))} if isinstance(timings, dict) else {}
        ours.settimeout(None)
        return self

    def _remove_probe_dir(self) -> None:
        if self._probe_dir is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self._probe_dir)
            self._probe_dir = None

    @property
    def alive(self) -> bool:
        """Whether the zygote is running: False before ``start``, after ``close``, and once
        it has ended for any reason (then every worker it would fork is lost)."""
        return self._proc is not None and self._proc.poll() is None

    def spawn(self, *, submission: str, lab: str, forbidden: list[str],
              importable: dict[str, list[str]] | None = None,
              answered_by: str = "own") -> Worker:
        """A fresh worker for ``lab`` whose only files are those in ``submission``.

        ``importable``: earlier lab -> the names ``lab`` may import of it (nothing else
        imports); ``answered_by``: "reference", each such name a stub answered through
        ``Worker.on_callback`` (protocol "Callbacks"), or "own", the lab's file in
        ``submission``."""
        if self._control is None or self._probe_dir is not None:
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
            "importable": {str(k): list(v) for k, v in (importable or {}).items()},
            "answered_by": answered_by,
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
        from grader.sandbox.channel import Worker
        return Worker(pid=int(reply["pid"]), sock=ours, mode=self.mode,
                      reply_bytes=self.limits.reply_mb << 20, lifeline=fds[0],
                      keeper=reply.get("keeper"))

    def close(self) -> None:
        self._drop_process()
        self._remove_probe_dir()
        if self._slot_lock is not None:
            os.close(self._slot_lock)       # the slot is free for the next zygote
            self._slot_lock = None

    def _drop_process(self) -> None:
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
