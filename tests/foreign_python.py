"""Run the grader's CLI as on a Python that lacks what Linux gives (native Windows, macOS).

``python tests/foreign_python.py {windows|macos} ARGS...`` removes, before the grader is
imported, the modules and calls such a Python lacks, then runs ``grader ARGS``: what the
grader does there is decided by what is importable and callable, so taking them away here
is what a student's laptop does to it. Workers the grader starts are real processes of this
machine's Python; ``portable_worker.py`` is run the same way (``--worker``) by the tests that
check its side.

windows: no fcntl, resource, termios, pwd, grp; no os.fork, os.unshare, os.getpgid, os.killpg,
os.setsid, os.sched_getaffinity, os.pread; no AF_UNIX, socket.send_fds/recv_fds, sendmsg,
recvmsg; no select.poll, signal.SIGALRM; no /proc is read (the grader cannot tell that
from a module, so it is asked through ``os.path.exists``, which says no for /proc here).
macos: fcntl, resource and fork exist; no os.unshare, os.sched_getaffinity, /proc, prctl.
"""

from __future__ import annotations

import builtins
import importlib.abc
import os
import select
import signal
import socket
import sys

MISSING = {
    "windows": {
        "modules": {"fcntl", "resource", "termios", "pwd", "grp", "posix"},
        "os": ["fork", "unshare", "getpgid", "killpg", "setsid", "sched_getaffinity",
               "pread", "wait4", "wait3", "getuid", "geteuid", "setuid", "setgid", "setgroups", "getpgrp"],
        "socket": ["AF_UNIX", "send_fds", "recv_fds", "SOCK_SEQPACKET"],
        "socket_methods": ["sendmsg", "recvmsg"],
        "select": ["poll", "epoll"],
        "signal": ["SIGALRM"],    # SIGKILL stays: this POSIX subprocess module needs it
    },
    "macos": {
        "modules": set(),
        "os": ["unshare", "sched_getaffinity", "pidfd_open", "setns"],
        "socket": [],
        "socket_methods": [],
        "select": ["epoll"],
        "signal": [],
    },
}


class _Refuse(importlib.abc.MetaPathFinder):
    def __init__(self, names):
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r} (simulated)",
                                      name=fullname)
        return None


class _Absent:
    """A method this platform's socket lacks: ``hasattr`` says no, a call fails as there."""

    def __get__(self, obj, owner=None):
        raise AttributeError("absent on this platform (simulated)")


def become(platform: str) -> None:
    """Take away what ``platform``'s Python lacks, in this process."""
    missing = MISSING[platform]
    for name in missing["modules"]:
        sys.modules.pop(name, None)
    sys.meta_path.insert(0, _Refuse(missing["modules"]))
    for module, key in ((os, "os"), (socket, "socket"), (select, "select"), (signal, "signal")):
        for attr in missing[key]:
            if hasattr(module, attr):
                delattr(module, attr)
    for attr in missing["socket_methods"]:
        setattr(socket.socket, attr, _Absent())     # a C method: hidden, not deleted
    # No /proc and no libc's prctl: what a Linux kernel alone has.
    real_exists, real_open = os.path.exists, builtins.open

    def exists(path):
        return False if str(path).startswith("/proc") else real_exists(path)

    def no_proc_open(path, *args, **kwargs):
        if isinstance(path, str) and path.startswith("/proc"):
            raise FileNotFoundError(2, "No such file (simulated)", path)
        return real_open(path, *args, **kwargs)

    os.path.exists = exists
    builtins.open = no_proc_open
    real_os_open = os.open

    def os_open(path, *args, **kwargs):
        if isinstance(path, str) and path.startswith("/proc"):
            raise FileNotFoundError(2, "No such file (simulated)", path)
        return real_os_open(path, *args, **kwargs)

    os.open = os_open


def main() -> int:
    platform, args = sys.argv[1], sys.argv[2:]
    become(platform)
    from grader.cli import main as grader_main
    return grader_main(args)


if __name__ == "__main__":
    sys.exit(main())
