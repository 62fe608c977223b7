"""The portable backend's worker: a fresh interpreter serving one lab (grader.sandbox.portable).

Started by the trusted grader as ``python -I portable_worker.py`` with a clean environment
and a private temporary folder as its cwd. It imports torch (one thread) while the grader
does other work, then reads one line from stdin: its config (the lab, the submission's
scratch folder, the forbidden names, the loopback port and a one-time token). It connects,
sends the token, applies the limits the platform has (CPU time and file size where the
``resource`` module exists), and serves requests with the same code as the jail's workers
(``worker.serve``): the same wire, protocol, import guards and forbidden-API checks.

Standard library, torch and its sibling modules only, loaded by path, like the zygote.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [HERE] + [p for p in sys.path if p and os.path.abspath(p) != HERE]

import torch  # noqa: E402

torch.set_num_threads(1)
for _name in ("torch.nn", "torch.nn.functional", "math", "numpy"):
    # A missing optional module only narrows what students may import.
    with contextlib.suppress(Exception):
        __import__(_name)

import forbidden  # noqa: E402
import jail  # noqa: E402
import worker  # noqa: E402


def adopt_orphans() -> None:
    """Where the kernel has it (Linux), this worker becomes its descendants' subreaper: a
    process the student's code detaches (a double fork, setsid) stays below it, where the
    grader finds and ends it (``portable.WorkerProcess.kill_tree``)."""
    if getattr(jail._libc, "prctl", None) is not None:
        with contextlib.suppress(OSError):
            jail.prctl(jail.PR_SET_CHILD_SUBREAPER, 1)


def apply_limits(limits: dict) -> None:
    """The rlimits this platform has (none on Windows: the grader's time limit kills)."""
    try:
        import resource
    except ImportError:
        return
    for which, value in (("RLIMIT_CPU", int(limits.get("cpu_s", 120))),
                         ("RLIMIT_FSIZE", int(limits.get("file_mb", 16)) << 20),
                         ("RLIMIT_CORE", 0)):
        key = getattr(resource, which, None)
        if key is None:
            continue
        try:
            hard = resource.getrlimit(key)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(key, (value, value))
        except (OSError, ValueError):
            pass


def main() -> None:
    adopt_orphans()
    line = sys.stdin.readline()
    if not line:
        return                      # the grader closed without giving a config (shutdown)
    config = json.loads(line)
    sock = socket.create_connection(("127.0.0.1", int(config["port"])), timeout=30)
    sock.settimeout(None)
    # The token, then this process's CPU time so far (torch's import): taken before any
    # student code runs, it is the baseline of a training's CPU time where the OS gives no
    # running process's figure (``portable.WorkerProcess.cpu_ns``).
    sock.sendall(config["token"].encode("ascii") + b"%020d" % time.process_time_ns())
    bindings = forbidden.index_bindings(config.get("forbidden_everywhere") or [])
    apply_limits(config.get("limits") or {})
    sys.stdin.close()
    worker.serve(sock, {**config, "folder": config["submission"]}, bindings)


if __name__ == "__main__":
    code = 0
    try:
        main()
    except BaseException:  # noqa: BLE001 - the grader sees a closed channel
        code = 70
    os._exit(code)
