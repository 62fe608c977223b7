"""The zygote: a torch-loaded process that forks one locked-down worker per request.

Started by the trusted grader as ``python -I zygote.py <fd>`` with an empty environment,
cwd /, and one control socket whose fd number is its only argument. It imports torch (with
one thread, so forked children do not deadlock on a started OpenMP pool) and the stdlib
modules students use, so workers pay milliseconds instead of seconds. It never loads the
grader package, a rubric, a test, a reference or an expected value: a fork copies memory,
so the zygote holds nothing secret.

Control messages (SOCK_SEQPACKET, JSON, one per datagram):
  grader -> zygote  {"mode": ..., "forbidden": [...], "probe": {...}}   once, at start
  zygote -> grader  {"ready": true, "mode": ..., "pid": ...}
  grader -> zygote  {"op": "spawn", "config": {...}} with the worker's channel fd attached
  zygote -> grader  {"pid": <worker pid>, "keeper": <pid>} with the lifeline fd attached,
                    or {"error": "..."}

Process tree of one worker:
  zygote -> keeper (trusted; enters the namespaces; stays outside the new PID namespace)
         -> worker (pid 1 of a new PID namespace in root/userns mode; locked down)
The keeper never reaps the worker while the grader holds the lifeline (the write end of a
pipe whose read end the keeper waits on), so the worker's pid cannot be reused while the
grader may still signal it. When the grader closes the lifeline (or dies), the keeper kills
the worker and every process below it, reaps them, removes the worker's private temp folder
(plain mode), and exits.

In root mode the zygote is the keeper itself ("zygote -> worker"): it forks the worker
straight into a new PID namespace (unshare(CLONE_NEWPID) before the fork, setns back to its
own after), the worker enters its other namespaces, and the zygote waits on every lifeline
in its main loop. That saves a fork and an exit of a torch-sized process per worker (~6 ms
of the ~15 ms a worker costs). The other modes need a keeper: a user namespace cannot be
left, and plain mode has no PID namespace to end everything at once.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time

_T0 = time.monotonic()
# No collection while torch loads (~10% of its import's CPU time here); ``settle`` collects
# once, freezes the heap and turns the collector back on before any worker is forked.
gc.disable()
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
    "importlib.util", "importlib.abc", "ast", "traceback", "io", "gc", "ctypes",
    "encodings.utf_8_sig", "encodings.latin_1", "encodings.ascii", "unittest", "threading",
    "signal", "socket", "tempfile", "shutil", "glob", "pathlib", "atexit", "weakref",
]
for _name in PRELOAD:
    # A missing optional module only narrows what students may use.
    with contextlib.suppress(Exception):
        __import__(_name)

import forbidden  # noqa: E402
import jail  # noqa: E402
import protocol  # noqa: E402
import wire  # noqa: E402
import worker  # noqa: E402

# Seconds since this file began, sent in the hello (what a grader waits for, phase by phase).
TIMINGS = {"imports_s": time.monotonic() - _T0}


def warm_up() -> None:
    """Run, once here, the torch code paths every worker would otherwise run cold.

    A forked worker starts from this process's memory, so lazy initialisation done here
    (dispatcher and autograd caches, modules imported inside functions, the interpreter's
    specialised bytecode) is not paid again by each of the thousands of workers of a batch.
    Only generic torch work and our own wire code run here: nothing of a submission, a
    test or a reference.
    """
    import torch.nn as nn
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(2, 5, 8, generator=gen, dtype=dtype)
        mask = torch.ones(5, 5, dtype=torch.bool).tril()
        layers = nn.ModuleDict({
            "q": nn.Linear(8, 8), "o": nn.Linear(8, 8, bias=False), "ln": nn.LayerNorm(8),
            "drop": nn.Dropout(0.1), "emb": nn.Embedding(5, 8),
        }).to(dtype)
        layers.register_buffer("pe", torch.zeros(5, 8, dtype=dtype))
        layers.load_state_dict({k: v.clone() for k, v in layers.state_dict().items()})
        for train in (False, True):
            layers.train(train)
            xin = x.clone().requires_grad_(True)
            q = layers["q"](layers["ln"](xin)).view(2, 5, 2, 4).transpose(1, 2)  # (B, h, T, d)
            scores = q @ q.transpose(-2, -1) / math.sqrt(4)
            weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            weights = F.softmax(layers["drop"](weights), -1).nan_to_num()
            out = torch.einsum("bhqk,bhkd->bhqd", weights, q).transpose(1, 2).contiguous()
            out = out.reshape(2, 5, 8) + layers.pe + layers["emb"](torch.arange(5))
            out = layers["o"](F.gelu(out) + F.relu(out) + F.dropout(out, 0.1, train))
            out = torch.cat([out, out.exp().log().sin().cos()], dim=-1).chunk(2, -1)[0]
            out = F.layer_norm(out, (8,)) + torch.tanh(out).sqrt().nan_to_num()
            (out * torch.ones_like(out)).sum().backward()
            F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        list(layers.named_parameters()), list(layers.named_buffers())   # as grad/buffer ops do
        torch.default_generator.manual_seed(0)
        wire.encode({"ok": (out.detach(), {"w": weights.detach()}, [1, 2.0])})
    # torch.broadcast_shapes' first call in a process imports sympy and torch's symbolic
    # shapes (+35 MB, ~0.35 s once here): a library's one-time cost, paid here so that no
    # worker pays it (a measured call forgives only a few MB kept by its warm-up).
    torch.broadcast_shapes((2, 1), (1, 3))
    _warm_request_loop()


class _WarmBlock(torch.nn.Module):
    """Our own stand-in for a lab module's class (the warm-up runs no student code)."""

    def __init__(self, d: int, dropout: float = 0.0):
        super().__init__()
        self.proj = torch.nn.Linear(d, d)
        self.norm = torch.nn.LayerNorm(d)
        self.drop = torch.nn.Dropout(dropout)
        self.register_buffer("scale", torch.ones(d))

    def forward(self, x, mask=None):
        y = self.drop(self.proj(self.norm(x))) * self.scale
        return y if mask is None else y.masked_fill(~mask[..., :1], 0.0)


def _warm_function(x, y=None, *, dim: int = -1):
    return torch.softmax(x if y is None else x @ y.transpose(-2, -1), dim=dim)


def _warm_request_loop() -> None:
    """Requests of every kind, built as the grader builds them (``protocol``), through wire
    and the worker's own handler, in this process.

    A worker's first requests otherwise run this code cold: decoding frames into tensors,
    building a module from ``ctor``, loading a state dict, a gradient request, the reply.
    The "lab module" is this file's own stand-in: nothing of a submission or a test.
    """
    import types

    lab = types.ModuleType("warm_lab")
    lab.Block, lab.fn = _WarmBlock, _warm_function
    server = worker.Server(None, {"lab": "warm_lab", "folder": "/nonexistent"})
    server.module = lab
    gen = torch.Generator().manual_seed(1)
    for dtype in ("float32", "float64"):
        tdtype = getattr(torch, dtype)
        x = torch.randn(2, 3, 4, generator=gen, dtype=tdtype)
        mask = torch.ones(3, 3, dtype=torch.bool).tril()
        state = {k: v.to(tdtype) for k, v in _WarmBlock(4).state_dict().items()}
        built = protocol.module_spec("Block", [4], {})
        requests = [
            protocol.probe_request(["fn", "Block", "missing"]),
            protocol.call_request("fn", [x, x], {"dim": -1}, seed=3),
            protocol.call_request(
                protocol.module_spec("Block", [4], {"dropout": 0.1}, state_dict=state,
                                     train=True, dtype=dtype),
                [x], {"mask": mask}, seed=5),
            protocol.grad_request(
                protocol.module_spec("Block", [4], {}, state_dict=state, dtype=dtype),
                [x], {}, [torch.ones_like(x)]),
            protocol.grad_request("fn", [x, None], {}, [torch.ones(2, 3, 4, dtype=tdtype)]),
            protocol.state_dict_request(built),
            protocol.buffer_request(built, "scale"),
            protocol.call_request("missing", [], {}),
        ]
        for req in requests:
            try:
                reply = {"ok": server.handle(wire.decode_frame(wire.encode(req)))}
            except Exception as exc:  # noqa: BLE001 - the error path is warmed too
                reply = {"error": worker.describe_exception(exc, "/nonexistent")}
            reply.update(stdout=server.stdout.take(), forbidden=forbidden.take_violations())
            wire.decode_frame(wire.encode(reply))
    torch.default_generator.manual_seed(0)      # every worker starts from the same state


def settle(many_workers: bool = True) -> int:
    """After the imports and the warm-up: freeze the heap, back it with huge pages.

    ``gc.freeze`` keeps the collector from walking (and so copying, page by page) every
    object inherited from here in each worker. Collapsing the anonymous memory into 2 MB
    pages cuts what every fork copies and every exit frees (fork + exit of a torch process:
    ~20 ms -> ~8 ms measured here): the page tables shrink 512-fold, and a worker's first
    write to such a page still copies 4 KB. Returns the number of regions collapsed; none
    where the kernel has no MADV_COLLAPSE (before Linux 6.1) or huge pages are off.

    Unless ``many_workers``, only the freeze: the full collection before it (0.1-0.5 s) and
    the collapse (0.1-1 s, more on a busy machine) pay off over a batch's thousands of
    forks, not over one submission's few; the garbage the imports left (a few thousand
    objects) is frozen with the rest.
    """
    if many_workers:
        gc.collect()
    gc.freeze()
    gc.enable()
    return jail.collapse_huge_pages() if many_workers else 0


# A warm-up that fails only makes workers slower, but it must not fail unseen: the grader
# gets the reason in the zygote's hello (``Zygote.warm_up``), and a test checks it is "ok".
try:
    warm_up()
    WARM_UP = "ok"
except Exception as _exc:  # noqa: BLE001
    WARM_UP = f"{type(_exc).__name__}: {_exc}"[:500]
TIMINGS["warm_up_s"] = time.monotonic() - _T0


# Root mode: lifeline read end -> the worker it keeps alive (the zygote is their keeper).
DIRECT: dict[int, int] = {}
_OWN_PID_NS: list[int] = []     # an fd on this process's own PID namespace, once opened


def spawn_direct(config: dict, channel_fd: int, mode: jail.SandboxMode,
                 bindings) -> tuple[dict, int | None]:
    """A mode with no keeper (root): fork the worker as pid 1 of a new PID namespace, kept
    by this process."""
    if not _OWN_PID_NS:
        _OWN_PID_NS.append(os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC))
    life_r, life_w = os.pipe()
    jail.unshare(jail.CLONE_NEWPID)           # for the next child only
    try:
        pid = os.fork()
    except BaseException:
        jail.setns(_OWN_PID_NS[0], jail.CLONE_NEWPID)
        os.close(life_r)
        os.close(life_w)
        raise
    if pid == 0:
        code = 70
        try:
            os.close(life_r)
            os.close(life_w)
            jail.unshare(jail.NAMESPACES & ~jail.CLONE_NEWPID)
            _run_worker(config, channel_fd, mode, bindings, None)
        finally:
            os._exit(code)
    # Children made after this one are in our own PID namespace again.
    jail.setns(_OWN_PID_NS[0], jail.CLONE_NEWPID)
    DIRECT[life_r] = pid
    return {"pid": pid, "keeper": None}, life_w


def end_direct(life_r: int) -> None:
    """The grader let go of this worker (closed its lifeline, or died): kill it, reap it."""
    pid = DIRECT.pop(life_r)
    os.close(life_r)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)   # pid 1 of its namespace: everything in it ends too
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def spawn(config: dict, channel_fd: int, mode: jail.SandboxMode,
          bindings) -> tuple[dict, int | None]:
    """Fork the keeper, which forks the worker; returns the reply and the lifeline fd."""
    if not mode.keeper:
        return spawn_direct(config, channel_fd, mode, bindings)
    status_r, status_w = os.pipe()
    life_r, life_w = os.pipe()
    keeper = os.fork()
    if keeper == 0:
        try:
            os.close(status_r)
            os.close(life_w)
            _keeper(config, channel_fd, mode, bindings, status_w, life_r)
        except BaseException as exc:  # noqa: BLE001
            with contextlib.suppress(OSError):
                os.write(status_w, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        os._exit(1)
    os.close(status_w)
    os.close(life_r)
    data = b""
    while chunk := os.read(status_r, 4096):
        data += chunk
    os.close(status_r)
    try:
        reply = json.loads(data or b"{}")
    except ValueError:
        reply = {}
    if "pid" not in reply:
        os.close(life_w)
        return {"error": reply.get("error", "the sandbox could not start")}, None
    reply["keeper"] = keeper
    return reply, life_w


def _keeper(config, channel_fd, mode, bindings, status_w, life_r):
    """The worker's trusted parent: namespaces in, worker out, then wait for the lifeline."""
    os.setsid()  # out of the zygote's process group: the grader never signals us by group
    # Hold nothing of the zygote's (its control socket to the grader above all).
    low = 3
    for fd in sorted({channel_fd, status_w, life_r}):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)
    private_tmp = None
    if mode.confined_by_landlock:            # no tmpfs of its own: a private folder
        private_tmp = tempfile.mkdtemp(prefix="grader-work-")
        if os.geteuid() == 0 and config.get("uid") is not None:
            os.chown(private_tmp, config["uid"], config["uid"])
        os.chmod(private_tmp, 0o700)
    jail.enter_namespaces(mode, config.get("uid"))
    # Plain mode has no PID namespace whose end kills everything: orphans come here.
    jail.prctl(jail.PR_SET_CHILD_SUBREAPER, 1)
    pid = os.fork()
    if pid == 0:
        os.close(status_w)
        os.close(life_r)
        _run_worker(config, channel_fd, mode, bindings, private_tmp)
    os.close(channel_fd)
    os.write(status_w, json.dumps({"pid": pid}).encode())
    os.close(status_w)
    try:
        while os.read(life_r, 4096):
            pass
    except OSError:
        pass
    # The grader is done with this worker (or gone): end it and everything below it.
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not mode.namespaces:                  # no PID namespace ends them with the worker
        _kill_descendants()
    _reap_all()
    if private_tmp:
        shutil.rmtree(private_tmp, ignore_errors=True)
    os._exit(0)


def _kill_descendants() -> None:
    """Kill every child until none is left (orphans of killed ones are re-parented here)."""
    for _ in range(1000):
        _reap_all(block=False)
        kids = jail.children_of(os.getpid())
        if not kids:
            return
        for kid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(kid, signal.SIGKILL)


def _reap_all(block: bool = True) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _run_worker(config, channel_fd, mode, bindings, private_tmp):
    code = 0
    debug_fd = None
    if config.get("debug"):
        debug_fd = os.dup2(2, 1000)
    try:
        info = jail.lock_down(
            mode=mode, channel_fd=channel_fd, submission=config["submission"],
            uid=config.get("uid"), read_only_paths=config["read_only_paths"],
            hide_paths=config["hide_paths"], limits=config["limits"],
            private_tmp=private_tmp, protected_pids=config.get("protected_pids", []),
            keep_fds=(debug_fd,) if debug_fd is not None else (),
        )
        sock = socket.socket(fileno=channel_fd)
        worker.serve(sock, {**config, **info}, bindings)
    except BaseException:  # noqa: BLE001 - the grader sees a closed channel
        if debug_fd is not None:
            import traceback
            os.write(debug_fd, traceback.format_exc().encode())
        code = 70
    os._exit(code)


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    jail.prctl(jail.PR_SET_PDEATHSIG, signal.SIGKILL)
    # Same-uid workers (plain mode) may neither ptrace nor write into this process.
    jail.prctl(jail.PR_SET_DUMPABLE, 0)
    hello = json.loads(control.recv(1 << 16))
    # The hello was sent as the grader started us: it has been waiting, and says whether
    # this zygote will fork many workers (a batch) or a few (one submission).
    collapsed = settle(many_workers=hello.get("many_workers", True) is not False)
    TIMINGS["settled_s"] = time.monotonic() - _T0
    mode = jail.MODES.get(hello.get("mode", "auto")) or jail.detect_mode(hello.get("probe"))
    bindings = forbidden.index_bindings(hello.get("forbidden", []))
    control.send(json.dumps({"ready": True, "mode": mode.name, "pid": os.getpid(),
                             "landlock": jail.landlock_abi(), "warm_up": WARM_UP,
                             "huge_page_regions": collapsed,
                             "timings": {**TIMINGS, "ready_s": time.monotonic() - _T0}}).encode())
    poller = select.poll()
    poller.register(control, select.POLLIN)
    try:
        _serve(control, poller, mode, bindings)
    finally:
        for life_r in list(DIRECT):
            end_direct(life_r)


def _serve(control, poller, mode: jail.SandboxMode, bindings) -> None:
    while True:
        ready = dict(poller.poll())
        for life_r in [fd for fd in ready if fd in DIRECT]:
            # Only EOF (the grader closed the lifeline) ends a worker; nobody writes into it.
            try:
                ended = not os.read(life_r, 4096)
            except OSError:
                ended = True
            if ended:
                poller.unregister(life_r)
                end_direct(life_r)
        if control.fileno() not in ready:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(control, 1 << 16, 1)
        except OSError:
            return
        if not msg:
            return
        if mode.keeper:
            # Keepers that ended. Never in root mode: there the workers are our children,
            # and one must stay unreaped (its pid not reusable) until its lifeline closes.
            _reap_all(block=False)
        try:
            request = json.loads(msg)
        except ValueError:
            request = {}
        if request.get("op") != "spawn" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"error": "bad control message"}).encode())
            continue
        lifeline = None
        try:
            reply, lifeline = spawn(request["config"], fds[0], mode, bindings)
        except Exception as exc:  # noqa: BLE001
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            os.close(fds[0])
        if lifeline is not None:
            socket.send_fds(control, [json.dumps(reply).encode()], [lifeline])
            os.close(lifeline)
            for life_r, pid in DIRECT.items():
                if pid == reply.get("pid"):
                    poller.register(life_r, select.POLLIN)
        else:
            control.send(json.dumps(reply).encode())


if __name__ == "__main__":
    main()
