"""Where student code runs: one interface, two backends, chosen by what this Python has.

The engine talks to one interface, a zygote-like object (``start``, ``spawn`` -> a
``channel.Worker``: send a call, receive a reply, ``kill``; ``close``). Two backends give it:

| backend  | where                        | isolation                              | limits                         | resource figures                    | grades for points |
|----------|------------------------------|----------------------------------------|--------------------------------|-------------------------------------|-------------------|
| jail     | Linux (root / userns / plain)| namespaces, seccomp, Landlock, own uid | rlimits, cgroup, kill          | cgroup peak, the kernel's CPU count | yes               |
| portable | anywhere, or forced          | a separate process, clean environment  | time limit by kill, output cap | not measured (said to the student)  | no (check only)   |

The portable backend starts each worker the platform's way (a fresh interpreter, never a
fork), speaks the same wire and protocol over a loopback socket, and runs the same call
plans, comparisons and messages, so a test passes or fails the same way on both. What it
cannot measure as the graded run does (memory peaks, lab 8's CPU budget where the OS gives
no running process's CPU time) is reported as "measured when your work is graded", never
passed or failed here. The choice is made by capability (what is importable and callable),
never by the platform's name: ``jail_missing`` lists what the jail needs and lacks.

This table is the one place the backends are described; docs/security.md quotes it.
"""

from __future__ import annotations

import importlib
import os
import socket
from dataclasses import dataclass

from grader.errors import NeedsJail, SandboxModeError

# GRADER_SANDBOX_MODE's values: auto (the jail where it can run, else portable), one of the
# jail's modes, or the portable backend.
JAIL_MODES = ("root", "userns", "plain")
MODE_NAMES = ("auto", *JAIL_MODES, "portable")


@dataclass(frozen=True)
class Backend:
    """What a backend provides (the module's table, row by row)."""
    name: str
    isolation: str
    limits: str
    resource_figures: str
    grades_for_points: bool
    measures_resources: bool


BACKENDS = {
    "jail": Backend("jail", isolation="namespaces, seccomp, Landlock, an unprivileged uid",
                    limits="rlimits, a memory cgroup, the time limit by kill",
                    resource_figures="a cgroup's peak, the kernel's CPU accounting",
                    grades_for_points=True, measures_resources=True),
    "portable": Backend("portable", isolation="a separate process, a clean environment",
                        limits="the time limit by kill, the output cap",
                        resource_figures="none: measured when the work is graded",
                        grades_for_points=False, measures_resources=False),
}


def requested_mode(environ=None) -> str:
    """The mode GRADER_SANDBOX_MODE asks for ("auto" when unset). SandboxModeError for a
    value that names no mode. The one place the variable is read."""
    value = (os.environ if environ is None else environ).get("GRADER_SANDBOX_MODE", "") or "auto"
    if value not in MODE_NAMES:
        raise SandboxModeError(
            f"GRADER_SANDBOX_MODE={value!r} is not a sandbox mode; use one of "
            + ", ".join(MODE_NAMES))
    return value


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def jail_missing() -> list[str]:
    """What the jail needs that this Python lacks (empty: the jail can run here)."""
    missing = [f"module {name}" for name in ("fcntl", "resource") if not _importable(name)]
    missing += [f"os.{name}" for name in ("fork", "getpgid", "killpg", "setsid")
                if not hasattr(os, name)]
    missing += [f"socket.{name}" for name in ("AF_UNIX", "SOCK_SEQPACKET", "send_fds")
                if not hasattr(socket, name)]
    if not os.path.exists("/proc/self/stat"):
        missing.append("/proc (the kernel's process accounting)")
    if not missing:
        from grader.sandbox import jail
        if jail._libc is None or not hasattr(jail._libc, "prctl"):
            missing.append("the C library's prctl")
    return missing


def backend_name(mode: str | None = None) -> str:
    """"jail" or "portable": the backend ``mode`` (default: GRADER_SANDBOX_MODE) gives on
    this machine."""
    if mode in (None, "auto"):
        mode = requested_mode()
    if mode == "portable":
        return "portable"
    if mode == "auto" and jail_missing():
        return "portable"
    return "jail"


def backend_of(zygote) -> Backend:
    """The row of the table for a zygote-like object ``new_zygote`` made."""
    return BACKENDS["portable" if getattr(zygote, "mode", "") == "portable" else "jail"]


def new_zygote(*, mode: str = "auto", **options):
    """A zygote-like object of the backend ``mode`` gives here (``options``: those of
    ``host.Zygote``)."""
    if backend_name(mode) == "portable":
        from grader.sandbox.portable import PortableZygote
        return PortableZygote(**options)
    from grader.sandbox.host import Zygote
    # GRADER_SANDBOX_MODE=root|userns|plain forces a jail mode (tests, odd platforms).
    return Zygote(mode=requested_mode() if mode == "auto" else mode, **options)


def require_jail(command: str) -> None:
    """NeedsJail unless the jail can grade here (and is not forced off)."""
    if backend_name() == "jail":
        return
    why = ("GRADER_SANDBOX_MODE=portable" if requested_mode() == "portable"
           else "this machine lacks " + ", ".join(jail_missing()))
    raise NeedsJail(f"grader {command} grades for points and needs the Linux sandbox "
                    f"({why}); on this machine `grader check` checks your work with the "
                    "portable backend")
