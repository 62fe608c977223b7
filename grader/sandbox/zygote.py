"""The zygote: a torch-loaded process that forks one locked-down worker per request.

Started by the trusted grader as ``python -I zygote.py`` with an empty environment, cwd /,
and one control socket whose fd number is its only argument. It imports torch (with one thread, so forked children do
not deadlock on a started OpenMP pool) and the stdlib modules students use, so workers pay
milliseconds instead of seconds. It never loads the grader package, a rubric, a test, a
reference or an expected value: a fork copies memory, so the zygote holds nothing secret.

Control messages (SOCK_SEQPACKET, JSON, one per datagram):
  grader -> zygote  {"op": "spawn", "config": {...}} with the worker's channel fd attached
  zygote -> grader  {"pid": <worker pid>} or {"error": "..."}
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [HERE] + [p for p in sys.path if p and os.path.abspath(p) != HERE]

import torch  # noqa: E402

torch.set_num_threads(1)
# Stdlib and torch modules a student file may import: loaded here because inside the jail
# the interpreter's own directories may be unreadable (e.g. a prefix under /root).
PRELOAD = [
    "math", "functools", "itertools", "collections", "typing", "dataclasses", "warnings",
    "numbers", "random", "copy", "enum", "abc", "contextlib", "operator", "string", "re",
    "types", "inspect", "textwrap", "statistics", "fractions", "decimal", "json", "time",
    "numpy", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.autograd",
    "torch.linalg", "torch.fft", "torch.testing", "torch.utils.checkpoint",
]
for _name in PRELOAD:
    try:
        __import__(_name)
    except Exception:  # noqa: BLE001 - a missing optional module only narrows what students may use
        pass

import jail  # noqa: E402
import wire  # noqa: E402,F401
import worker  # noqa: E402


def spawn(config: dict, channel_fd: int, mode: str, bindings) -> dict:
    """Fork the worker (through a short-lived first child that enters the namespaces)."""
    r, w = os.pipe()
    first = os.fork()
    if first == 0:
        try:
            os.close(r)
            jail.prctl(jail.PR_SET_PDEATHSIG, signal.SIGKILL)
            jail.enter_namespaces(mode)
            pid = os.fork()
            if pid == 0:
                os.close(w)
                _run_worker(config, channel_fd, mode, bindings)
            os.write(w, json.dumps({"pid": pid}).encode())
            os.close(w)
            os.close(channel_fd)
            # Stay as the worker's parent: when we die (the zygote died), it dies too.
            os.waitpid(pid, 0)
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001
            os.write(w, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
            os._exit(1)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    return json.loads(data or b'{"error": "the sandbox could not start"}')


def _run_worker(config, channel_fd, mode, bindings):
    code = 0
    if config.get("debug"):
        config["debug_fd"] = os.dup2(2, 1000)
    try:
        folder = jail.lock_down(
            mode=mode, channel_fd=channel_fd, submission=config["submission"],
            uid=config.get("uid"), read_only_paths=config["read_only_paths"],
            hide_paths=config["hide_paths"], limits=config["limits"],
        )
        sock = socket.socket(fileno=channel_fd)
        worker.serve(sock, {**config, "folder": folder}, bindings)
    except BaseException:  # noqa: BLE001 - the grader sees a closed channel
        if config.get("debug"):
            import traceback
            os.write(config["debug_fd"], traceback.format_exc().encode())
        code = 70
    os._exit(code)


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    jail.prctl(jail.PR_SET_PDEATHSIG, signal.SIGKILL)
    jail.prctl(jail.PR_SET_CHILD_SUBREAPER, 1)
    hello = json.loads(control.recv(1 << 16))
    mode = jail.detect_mode() if hello.get("mode", "auto") == "auto" else hello["mode"]
    bindings = worker.index_bindings(hello.get("forbidden", []))
    control.send(json.dumps({"ready": True, "mode": mode, "pid": os.getpid()}).encode())
    while True:
        msg, fds, _, _ = socket.recv_fds(control, 1 << 16, 1)
        if not msg:
            return
        reap()
        request = json.loads(msg)
        if request.get("op") != "spawn" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"error": "bad control message"}).encode())
            continue
        try:
            reply = spawn(request["config"], fds[0], mode, bindings)
        finally:
            os.close(fds[0])
        control.send(json.dumps(reply).encode())


if __name__ == "__main__":
    main()
