"""The sandbox itself, mode by mode: what a worker can see and do, and what it cannot.

A probe "lab" (tests/fixtures/attacks/_probe/lab9_probe.py) runs inside real workers and
reports what happened; the assertions are about the trusted side's view. Every mode this
machine allows is tested: ``root`` (when the tests run as root), ``userns`` and ``plain``
(forced). Attacks through the whole grading pipeline live in test_attacks.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import threading
import time
from pathlib import Path

import pytest
import torch

from grader import paths
from grader.course import Course
from grader.sandbox import Limits, WorkerDied, WorkerTimeout, Zygote, make_scratch, wire
from grader.sandbox.host import SLOT_UID_BASE
from grader.sandbox.jail import children_of

PROBE = Path(__file__).parent / "fixtures" / "attacks" / "_probe" / "lab9_probe.py"
LAB = "lab9_probe"
FORBIDDEN = ("torch.nn.functional.scaled_dot_product_attention",
             "torch.nn.functional.multi_head_attention_forward",
             "torch.nn.MultiheadAttention", "torch.nn.TransformerEncoderLayer",
             "torch.nn.TransformerEncoder", "torch.nn.Transformer")
SLOT = 20 + os.getpid() % 20          # a uid of our own: other test runs use other slots
MODES = (["root"] if os.geteuid() == 0 else []) + ["userns", "plain"]


def _zygote(mode: str, **limits) -> Zygote:
    # What a Grader of the kit's course hides from its workers (``Course.private_paths``).
    z = Zygote(forbidden=FORBIDDEN, mode=mode, slot=SLOT, limits=Limits(**limits),
               hide=Course(paths.KIT).private_paths).start()
    if z.mode != mode:
        z.close()
        pytest.skip(f"this machine cannot give mode {mode}")
    return z


SECRET = f"xyz-{os.getpid()}-{time.time_ns()}-secret"


@pytest.fixture(scope="module")
def zygotes():
    """Zygotes by mode, started while the grader's environment holds GRADER_SECRET."""
    old = os.environ.get("GRADER_SECRET")
    os.environ["GRADER_SECRET"] = SECRET
    started: dict[str, Zygote] = {}
    yield started
    for z in started.values():
        z.close()
    if old is None:
        os.environ.pop("GRADER_SECRET", None)
    else:
        os.environ["GRADER_SECRET"] = old


@pytest.fixture(params=MODES)
def mode(request):
    return request.param


@pytest.fixture
def zyg(mode, zygotes) -> Zygote:
    if mode not in zygotes:
        try:
            zygotes[mode] = _zygote(mode)
        except Exception as exc:  # noqa: BLE001
            pytest.skip(f"mode {mode} unavailable here: {exc}")
    return zygotes[mode]


@pytest.fixture(scope="module")
def scratch():
    files = {PROBE.name: PROBE.read_bytes()}
    for f in (paths.KIT / "solutions").glob("lab*.py"):
        files[f.name] = f.read_bytes()
    s = make_scratch(files)
    yield s.name
    s.cleanup()


def call(worker, target, *args, timeout=20, **kwargs):
    reply = worker.request({"op": "call", "target": target, "args": list(args),
                            "kwargs": kwargs, "seed": 0}, timeout_s=timeout)
    assert "ok" in reply, reply
    return reply["ok"]


@pytest.fixture
def worker(zyg, scratch):
    w = zyg.spawn(submission=scratch, lab=LAB, forbidden=[])
    yield w
    w.kill()


def _gone(pid: int, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        time.sleep(0.05)
    return False


def _processes_named(name: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            if f"({name})" in stat and stat.rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry))
    return found


# ------------------------------------------------------------------------------ wire

def test_wire_round_trip_and_plain_tensors():
    value = {"a": (torch.arange(6, dtype=torch.float32).reshape(2, 3), None, 1.5, "x"),
             "__dunder__": [True, -3, torch.zeros(0, 4, dtype=torch.bool)],
             "bf": torch.ones(2, dtype=torch.bfloat16), "nan": float("nan")}
    a, b = socket.socketpair()
    wire.send_frame(a, value)
    got = wire.recv_frame(b)
    assert torch.equal(got["a"][0], value["a"][0]) and got["a"][1:] == (None, 1.5, "x")
    assert type(got["a"][0]) is torch.Tensor
    assert got["__dunder__"][:2] == [True, -3] and got["__dunder__"][2].shape == (0, 4)
    assert got["bf"].dtype == torch.bfloat16 and got["nan"] != got["nan"]


def test_wire_parts_are_the_frame_and_views_of_contiguous_tensors():
    """A worker sends a call into another lab from its tensors' own memory: the chunks of
    ``encode_parts`` make the same frame as ``encode`` for every dtype and layout, and a
    contiguous tensor's chunk is a view of it, not a copy (the relay's cost, #24)."""
    big = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    value = {"t": (big, big.t(), torch.tensor(2.5, dtype=torch.float64),
                   torch.ones(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.float16),
                   torch.tensor([True, False, True]), torch.zeros(0, 2, dtype=torch.int8)),
             "n": 3}
    chunks = wire.encode_parts(value)
    assert b"".join(chunks) == wire.encode(value)
    got = wire.decode_frame(b"".join(chunks))
    for sent, came in zip(value["t"], got["t"], strict=True):
        assert came.dtype == sent.dtype and torch.equal(came, sent.contiguous())
    view = chunks[1]
    big[0, 0] = 99.0                    # the chunk is the tensor's memory
    assert bytes(view[:4]) == struct.pack("<f", 99.0)


def test_wire_send_parts_sends_the_whole_frame_whatever_the_socket_takes():
    """More buffers than one sendmsg takes (1,401 here) and more bytes than the socket holds
    (1.2 MB): the frame arrives whole and in order."""
    import threading
    value = {"many": [torch.full((3,), float(i)) for i in range(700)],
             "big": torch.arange(300_000, dtype=torch.float32)}
    a, b = socket.socketpair()
    got = {}
    reader = threading.Thread(target=lambda: got.update(frame=wire.recv_frame(b)))
    reader.start()
    wire.send_parts(a, wire.encode_parts(value))
    reader.join(30)
    frame = got["frame"]
    assert torch.equal(frame["big"], value["big"])
    assert all(torch.equal(x, y) for x, y in zip(frame["many"], value["many"], strict=True))


def _frame(header: bytes, buffers=()) -> bytes:
    payload = b"".join(buffers)
    return struct.pack(">IQ", len(header), len(payload)) + header + payload


@pytest.mark.parametrize("header,buffers", [
    (b"not json", ()),
    (b'{"__tensor__": 0, "dtype": "object", "shape": [1]}', (b"\0" * 8,)),
    (b'{"__tensor__": 0, "dtype": "float32", "shape": [3]}', (b"\0" * 8,)),
    (b'{"__tensor__": 0, "dtype": "float32", "shape": [-1]}', (b"",)),
    (b'{"__tensor__": 1, "dtype": "float32", "shape": [1]}', (b"\0" * 4,)),
    (b'[{"__tensor__": 0, "dtype": "float32", "shape": [1]},'
     b' {"__tensor__": 0, "dtype": "float32", "shape": [1]}]', (b"\0" * 8,)),
    (b'{"__tensor__": true, "dtype": "float32", "shape": [1]}', (b"\0" * 4,)),
    (b'{"__dict__": 5}', ()),
    (b'{"__dict__": [[1, 2]]}', ()),
    (b'{"__float__": "1e3"}', ()),
    (b'[NaN]', ()), (b'[1e999]', ()),
    (b"[" * 100000 + b"]" * 100000, ()),
    (b'"unused buffer"', (b"x",)),
])
def test_wire_rejects_malformed_frames_with_wire_error_only(header, buffers):
    a, b = socket.socketpair()
    a.sendall(_frame(header, buffers))
    with pytest.raises(wire.WireError):
        wire.recv_frame(b)
    with pytest.raises(wire.WireError):
        wire.decode_frame(_frame(header, buffers))


def test_wire_decode_frame_reads_a_whole_frame_and_nothing_else():
    frame = wire.encode({"x": torch.arange(3.0), "n": 2})
    got = wire.decode_frame(frame)
    assert torch.equal(got["x"], torch.arange(3.0)) and got["n"] == 2
    for bad in (frame[:-1], frame + b"\0", frame[:5]):
        with pytest.raises(wire.WireError):
            wire.decode_frame(bad)


def test_wire_deadline_covers_a_trickled_frame():
    a, b = socket.socketpair()
    frame = wire.encode({"x": "y" * 50})

    def trickle():
        for byte in frame:
            try:
                a.send(bytes([byte]))
            except OSError:
                return
            time.sleep(0.2)

    threading.Thread(target=trickle, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(socket.timeout):
        wire.recv_frame(b, deadline=time.monotonic() + 1.0)
    assert time.monotonic() - t0 < 2.0
    a.close()


# ------------------------------------------------------------------------------ isolation

def test_worker_runs_unprivileged_with_a_clean_environment(worker, zyg, mode, monkeypatch):
    info = call(worker, "ids")
    if os.geteuid() == 0:
        # The slot the zygote holds (SLOT, or the next free one: zygotes never share one).
        assert info["uid"] == info["euid"] == SLOT_UID_BASE + zyg.slot
        assert info["groups"] == []
    else:
        assert info["uid"] == os.getuid()
    env = call(worker, "environ")
    assert "GRADER_SECRET" not in str(env)
    assert set(env["os.environ"]) <= {"HOME", "TMPDIR", "PATH", "OMP_NUM_THREADS"}


def test_grader_secrets_never_reach_a_worker(zyg, scratch):
    secret = SECRET
    assert os.environ["GRADER_SECRET"] == secret
    w = zyg.spawn(submission=scratch, lab=LAB, forbidden=[])
    try:
        seen = str(call(w, "environ"))
        ppid_env = call(w, "read", f"/proc/{os.getpid()}/environ")
        own_cmdline = call(w, "read", f"/proc/{os.getpid()}/cmdline")
    finally:
        w.kill()
    assert secret not in seen and secret not in str(ppid_env)
    assert not ppid_env["ok"] and not own_cmdline["ok"]


def test_only_the_channel_is_open(worker):
    fds = call(worker, "open_fds")
    assert fds[:3] == [0, 1, 2] and len(fds) == 4, fds   # stdio on /dev/null + the channel


@pytest.mark.parametrize("secret", ["grader", "solutions", "rubric"])
def test_grader_files_are_invisible(worker, secret):
    path = {"grader": paths.SUITES / "hidden" / "test_lab1_attention.py",
            "solutions": (paths.KIT / "solutions") / "lab1_attention.py",
            "rubric": (paths.KIT / "rubric.yaml")}[secret]
    got = call(worker, "read", str(path))
    assert not got["ok"], got
    listing = call(worker, "read", str(path.parent))
    assert not listing["ok"] or path.name not in listing["value"], listing


def test_worker_cannot_write_outside_its_temp_area(worker, tmp_path, scratch):
    os.chmod(tmp_path, 0o777)
    for target in (tmp_path / "pwned", Path(scratch) / "pwned", Path("/tmp") / f"pwned-{SLOT}",
                   (paths.KIT / "solutions") / "pwned"):
        got = call(worker, "write", str(target))
        assert not target.exists(), target
        if got["ok"]:   # a private tmpfs: written there, invisible here
            assert str(target).startswith("/tmp/")
    assert call(worker, "write", "own_temp_file.txt")["ok"]


def test_pid_namespace_or_process_cleanup(worker, mode):
    pids = call(worker, "visible_pids")
    if mode in ("root", "userns"):
        assert pids["value"] == [1], pids    # alone in its PID namespace
    else:
        assert not pids["ok"] or os.getpid() not in pids["value"]


def test_no_network(worker, tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.1)
    port = server.getsockname()[1]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.1)
    unix_path = str(tmp_path / "s.sock")
    os.chmod(tmp_path, 0o777)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    os.chmod(unix_path, 0o777)
    unix.listen()
    unix.settimeout(0.1)
    assert not call(worker, "connect_tcp", port)["ok"]
    assert not call(worker, "send_udp", udp.getsockname()[1])["ok"] or True
    assert not call(worker, "connect_unix", unix_path)["ok"]
    for s in (server, unix):
        with pytest.raises(socket.timeout):
            s.accept()
    with pytest.raises(socket.timeout):
        udp.recvfrom(100)


def test_dangerous_system_calls_are_refused(worker, mode):
    got = call(worker, "syscalls")
    for name in ("unshare_user", "unshare_net", "ptrace_traceme", "mount"):
        assert got[name] != "allowed", got
    if mode == "plain":
        assert got["socket_inet"] != "allowed"


def test_worker_cannot_signal_the_grader(worker, mode):
    hits = []
    old = signal.signal(signal.SIGUSR2, lambda *a: hits.append(1))
    try:
        got = call(worker, "kill", os.getpid())
        got_group = call(worker, "kill", -os.getpgrp())
        time.sleep(0.2)
    finally:
        signal.signal(signal.SIGUSR2, old)
    assert not hits, (got, got_group)


# ------------------------------------------------------------------------------ limits

def test_wall_clock_limit_kills_a_sleeper(worker):
    t0 = time.monotonic()
    with pytest.raises(WorkerTimeout):
        worker.request({"op": "call", "target": "sleep", "args": [60], "kwargs": {}},
                       timeout_s=1.0)
    assert time.monotonic() - t0 < 3
    assert _gone(worker.pid)


def test_cpu_limit_cannot_be_dodged_with_a_sigxcpu_handler(zyg, scratch):
    default = zyg.limits
    zyg.limits = Limits(cpu_s=1)      # limits travel with each spawn request
    try:
        w = zyg.spawn(submission=scratch, lab=LAB, forbidden=[])
    finally:
        zyg.limits = default
    try:
        t0 = time.monotonic()
        with pytest.raises(WorkerDied):
            w.request({"op": "call", "target": "spin", "args": [30], "kwargs": {}},
                      timeout_s=20)
        assert time.monotonic() - t0 < 6   # killed by the CPU limit, not the wall clock
    finally:
        w.kill()


def test_memory_file_size_and_open_files_are_capped(worker):
    assert not call(worker, "allocate", 4096)["ok"]          # 4 GiB > memory_mb
    assert call(worker, "allocate", 64)["ok"]
    big = call(worker, "big_file", 64)                       # 64 MiB > file_mb / tmp_mb
    assert not big["ok"]
    many = call(worker, "many_files", 500)
    assert many["opened"] < 100 and many.get("errno") is not None


def test_exit_and_interrupt_are_a_dead_worker_not_a_dead_grader(zyg, scratch):
    for target in ("exit_now", "raise_keyboard_interrupt"):
        w = zyg.spawn(submission=scratch, lab=LAB, forbidden=[])
        try:
            reply = w.request({"op": "call", "target": target, "args": [], "kwargs": {}},
                              timeout_s=10)
            assert reply["error"]["type"] == "KeyboardInterrupt"
        except WorkerDied:
            assert target == "exit_now"
        finally:
            w.kill()


def test_a_worker_may_start_threads_but_no_process(zyg, scratch):
    """Work done in another process is not in the worker's accounting (an auto-reaped child,
    SIGCHLD ignored, is never added to its cutime: atk_sigchld_ign_fork_generate), so the
    worker starts none, by any route: seccomp refuses a clone without CLONE_THREAD, fork
    and vfork, and the worker names the refusal from Python before the kernel has to."""
    w = zyg.spawn(submission=scratch, lab=LAB, forbidden=[])
    try:
        got = call(w, "start_processes", timeout=30)
        assert not w.has_children()
    finally:
        w.kill()
    # (Some modes' roots lack what multiprocessing imports: then it is no route at all.)
    assert got.pop("multiprocessing") in ("refused", "ModuleNotFoundError"), got
    assert got == {"os.fork": "refused", "subprocess": "refused", "os.posix_spawn": "refused",
                   "os.system": "refused",
                   "libc fork": "refused", "fork syscall": "refused",
                   "vfork syscall": "refused", "clone syscall": "refused",
                   "thread": "started"}, got


def test_no_worker_may_lock_a_file(zyg, scratch):
    """A file every worker can open (its own lab file, a library) holds a lock table that
    workers could talk through (atk_flock_relay_generate carried a recompute that way to
    another worker): seccomp refuses flock and fcntl's record locks; other fcntl commands
    still work."""
    w = zyg.spawn(submission=scratch, lab=LAB, forbidden=[])
    try:
        got = call(w, "file_locks", "/usr/lib/os-release" if os.path.exists(
            "/usr/lib/os-release") else "/etc/os-release")
    finally:
        w.kill()
    assert got == {"flock": "refused", "F_SETLK": "refused", "F_GETLK": "refused",
                   "F_OFD_SETLK": "refused", "F_GETFD": "allowed"}, got


def test_a_fork_bomb_starts_nothing(zyg, scratch):
    w = zyg.spawn(submission=scratch, lab=LAB, forbidden=[])
    try:
        got = call(w, "fork_bomb", timeout=30)
        assert got == {"forked": 0, "errno": 1}, got       # EPERM at the first fork
        assert not w.has_children()
    finally:
        w.kill()
    assert _processes_named("atkforkbomb") == []


def test_a_setsid_daemon_is_never_started(zyg, scratch, tmp_path):
    """The double fork's first fork is refused: no daemon, and nothing it would have written
    (test_portable covers the portable backend, where a child can still be started)."""
    os.chmod(tmp_path, 0o777)
    target = tmp_path / "daemon.txt"
    w = zyg.spawn(submission=scratch, lab=LAB, forbidden=[])
    try:
        reply = w.request({"op": "call", "target": "daemon", "args": [str(target)],
                           "kwargs": {}, "seed": 0}, timeout_s=20)
        assert reply["error"]["type"] == "PermissionError", reply
        assert "runs in this one process" in reply["error"]["message"], reply
        assert not w.has_children()
    finally:
        w.kill()
    time.sleep(0.3)
    assert _processes_named("atkdaemon") == [] and not target.exists()


def test_killing_the_lifeline_ends_worker_and_keeper(zyg, scratch):
    w = zyg.spawn(submission=scratch, lab=LAB, forbidden=[])
    call(w, "ids")
    keeper = w.keeper
    os.close(w.lifeline)       # as if the grader had died
    w.lifeline = None
    assert _gone(w.pid) and _gone(keeper)
    w.alive = False


def test_zygote_warm_up_runs_without_error(zyg):
    # The warm-up is what makes a fresh worker's first calls cheap; a failure in it only
    # slows workers down, so nothing else would notice (it once stopped half-way unseen).
    assert zyg.warm_up == "ok"


def test_a_launched_zygote_is_waited_for_once_and_reports_its_start(scratch):
    """``launch`` starts the process without waiting (the grader imports torch meanwhile);
    ``start`` waits for the hello; neither starts a second process. Made for few workers
    (one submission), the zygote collapses no memory and serves workers all the same."""
    z = Zygote(forbidden=FORBIDDEN, slot=SLOT, many_workers=False)
    try:
        assert z.launch() is z and z.alive and z.pid is None      # no hello read yet
        proc = z._proc
        z.launch()
        assert z._proc is proc                                     # launched once
        probe_dir = z._probe_dir
        assert probe_dir is not None and os.path.isdir(probe_dir)
        z.start()
        assert z._proc is proc and z.pid == proc.pid and z.warm_up == "ok"
        assert z.huge_page_regions == 0
        assert not os.path.exists(probe_dir)                       # gone with the hello
        t = z.timings
        assert 0 < t["imports_s"] <= t["warm_up_s"] <= t["settled_s"] <= t["ready_s"] < 120
        z.start()
        assert z._proc is proc                                     # started: a no-op
        w = z.spawn(submission=scratch, lab=LAB, forbidden=[])
        try:
            assert call(w, "echo", torch.arange(3)).tolist() == [0, 1, 2]
        finally:
            w.kill()
    finally:
        z.close()
    assert not z.alive and z._probe_dir is None


def test_a_zygote_launched_but_never_started_is_closed_cleanly():
    z = Zygote(forbidden=FORBIDDEN, slot=SLOT).launch()
    pid, probe_dir = z._proc.pid, z._probe_dir
    z.close()
    assert _gone(pid) and not os.path.exists(probe_dir) and not z.alive


def test_torch_threads_after_fork_do_not_deadlock(worker):
    t0 = time.monotonic()
    threads, right = call(worker, "threads_matmul", 1024, 2, timeout=60)
    assert right and threads == 2
    assert time.monotonic() - t0 < 30


def test_inputs_mutated_in_the_worker_stay_unchanged_here(worker):
    x = torch.ones(3, 4)
    got = call(worker, "mutate_and_return", x)
    assert torch.equal(x, torch.ones(3, 4)) and torch.equal(got, torch.zeros(3, 4))


def test_tensor_subclasses_come_back_as_plain_tensors(worker):
    got = call(worker, "subclass_output", [2, 3])
    assert type(got) is torch.Tensor and torch.equal(got, torch.zeros(2, 3))


def test_grader_and_pytest_are_not_loaded_in_a_worker(worker):
    assert call(worker, "modules") == []
    assert not call(worker, "try_import", "grader")["ok"]


# ------------------------------------------------------------------------------ forbidden APIs

BYPASSES = {
    "getattr": "getattr(F, 'scaled_dot' + '_product_attention')(q, q, q)",
    "dict": "F.__dict__['scaled_dot_product_attention'](q, q, q)",
    "vars": "vars(F)['scaled_dot_product_attention'](q, q, q)",
    "torch._C._nn": "torch._C._nn.scaled_dot_product_attention(q, q, q)",
    "ops": "torch.ops.aten.scaled_dot_product_attention(q, q, q)",
    "ops.default": "torch.ops.aten.scaled_dot_product_attention.default(q, q, q)",
    "ops.math": "torch.ops.aten._scaled_dot_product_attention_math(q, q, q)",
    "flash_cpu": "torch._scaled_dot_product_flash_attention_for_cpu(q[None], q[None], q[None])",
    "jit_op": "torch._C._jit_get_operation('aten::scaled_dot_product_attention')[0](q, q, q)",
    "dunder_import": "__import__('torch.nn.functional').nn.functional"
                     ".scaled_dot_product_attention(q, q, q)",
    "reload": "importlib.reload(F).scaled_dot_product_attention(q, q, q)",
    "reimport": "(sys.modules.pop('torch.nn.functional'), importlib.import_module("
                "'torch.nn.functional'))[1].scaled_dot_product_attention(q, q, q)",
    "gc": "every_gc_candidate('scaled_dot_product_attention')",
    "decomp": "torch._decomp.decompositions.scaled_dot_product_flash_attention_for_cpu("
              "q[None], q[None], q[None])",
    "flex": "importlib.import_module('torch.nn.attention.flex_attention')",
    "mha_forward": "F.multi_head_attention_forward(q, q, q, 4, 2, None, None, None, None, "
                   "False, 0.0, None, None)",
    "mha_class": "getattr(torch.nn, 'Multihead' + 'Attention')(4, 2)(q, q, q)",
    "mha_native": "torch._native_multi_head_attention(q, q, q, 4, 2, torch.eye(12), "
                  "torch.zeros(12), torch.eye(4), torch.zeros(4))",
    "jit_script": "torch.jit.CompilationUnit('def f(a):\\n    return torch.nn.functional."
                  "scaled_dot_product_attention(a, a, a)\\n').f(q)",
    "jit_script_ops": "torch.jit.CompilationUnit('def f(a):\\n    return torch.ops.aten."
                      "scaled_dot_product_attention(a, a, a)\\n').f(q)",
}
ANY_BLOCK = {"reload", "reimport", "jit_script"}   # refused, not necessarily by a guard


def _bypass_lab(tmp_path: Path) -> str:
    lines = ["import gc, importlib, sys", "import torch", "import torch.nn.functional as F",
             "q = torch.randn(2, 3, 4)", "", "def attempt(name):",
             "    try:", "        result = eval(CODE[name])", "    except BaseException as exc:",
             "        return 'blocked: ' + type(exc).__name__ + ': ' + str(exc)[:300]",
             "    return 'PASSED: ' + type(result).__name__", "",
             "def every_gc_candidate(name):",
             "    errors = []",
             "    for o in gc.get_objects():",
             "        if callable(o) and getattr(o, '__name__', '') == name:",
             "            try:",
             "                return o(q, q, q)",
             "            except BaseException as exc:",
             "                errors.append(exc)",
             "    raise next((e for e in errors if type(e).__name__ == 'ForbiddenAPIError'),",
             "               errors[0] if errors else LookupError(name))", "", "CODE = {"]
    lines += [f"    {k!r}: {v!r}," for k, v in BYPASSES.items()] + ["}"]
    folder = tmp_path / "bypass"
    folder.mkdir()
    (folder / "lab1_attention.py").write_text("\n".join(lines) + "\n")
    os.chmod(tmp_path, 0o755)
    os.chmod(folder, 0o755)
    os.chmod(folder / "lab1_attention.py", 0o644)
    return str(folder)


@pytest.mark.parametrize("how", list(BYPASSES))
def test_forbidden_api_bypasses_are_blocked(zygotes, scratch, tmp_path, how):
    z = zygotes.get("root") or zygotes.get("userns") or zygotes.setdefault(
        MODES[0], _zygote(MODES[0]))
    folder = _bypass_lab(tmp_path)
    lab1_forbidden = ["torch.nn.functional.scaled_dot_product_attention",
                      "torch.nn.functional.multi_head_attention_forward",
                      "torch.nn.MultiheadAttention"]
    w = z.spawn(submission=folder, lab="lab1_attention", forbidden=lab1_forbidden)
    try:
        reply = w.request({"op": "call", "target": "attempt", "args": [how], "kwargs": {}},
                          timeout_s=30)
    finally:
        w.kill()
    result = reply.get("ok", "")
    assert result.startswith("blocked"), reply
    if how == "gc" and result.startswith("blocked: LookupError"):
        # The zygote's heap is frozen (gc.freeze): gc.get_objects() cannot even list the
        # original function, so the scan finds nothing to call.
        assert reply["forbidden"] == [], reply
    elif how not in ANY_BLOCK:
        # reported by name even though the student caught the exception
        assert reply["forbidden"] == ["torch.nn.functional.scaled_dot_product_attention"] or (
            how.startswith("mha") and reply["forbidden"]), reply
    elif how != "jit_script":
        assert "already loaded" in result, reply


def test_static_scan_names_the_forbidden_api(zygotes, tmp_path):
    z = zygotes.get("root") or zygotes.get("userns") or zygotes.setdefault(
        MODES[0], _zygote(MODES[0]))
    folder = tmp_path / "static"
    folder.mkdir()
    (folder / "lab1_attention.py").write_text(
        "import torch.nn.functional as F\n\n"
        "def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0, training=False):\n"
        "    if False:\n        return F.scaled_dot_product_attention(q, k, v)\n")
    os.chmod(tmp_path, 0o755)
    os.chmod(folder, 0o755)
    w = z.spawn(submission=str(folder), lab="lab1_attention",
                forbidden=["torch.nn.functional.scaled_dot_product_attention"])
    try:
        reply = w.request({"op": "probe"}, timeout_s=20)
    finally:
        w.kill()
    assert reply["error"]["type"] == "ForbiddenAPIError"
    assert "lab1_attention.py:5" in reply["error"]["message"]
    assert "torch.nn.functional.scaled_dot_product_attention" in reply["error"]["message"]


def test_allowed_uses_are_not_flagged(zygotes, scratch):
    """lab2 calling lab1's own function, lab4 using the given nn.MultiheadAttention."""
    z = zygotes.get("root") or zygotes.get("userns") or zygotes.setdefault(
        MODES[0], _zygote(MODES[0]))
    x = torch.randn(2, 5, 16)
    lab2 = ["torch.nn.functional.scaled_dot_product_attention",
            "torch.nn.functional.multi_head_attention_forward", "torch.nn.MultiheadAttention"]
    # A lab imports another lab only where it is told it may (#25: the earlier lab's
    # contract functions), here answered by the submission's own lab 1.
    w = z.spawn(submission=scratch, lab="lab2_multihead", forbidden=lab2,
                importable={"lab1_attention": ["scaled_dot_product_attention", "causal_mask"]},
                answered_by="own")
    try:
        reply = w.request({"op": "call", "target": "MultiHeadAttention", "ctor": {
            "args": [16, 4], "kwargs": {}}, "args": [x, x, x], "kwargs": {}}, timeout_s=20)
    finally:
        w.kill()
    assert "ok" in reply and not reply["forbidden"], reply
    if not (Path(scratch) / "lab4_transformer_block.py").exists():
        return
    lab4 = ["torch.nn.TransformerEncoderLayer", "torch.nn.TransformerEncoder",
            "torch.nn.Transformer"]
    w = z.spawn(submission=scratch, lab="lab4_transformer_block", forbidden=lab4)
    try:
        reply = w.request({"op": "call", "target": "TransformerBlock", "ctor": {
            "args": [16, 4, 32], "kwargs": {}}, "args": [x], "kwargs": {}}, timeout_s=20)
    finally:
        w.kill()
    assert "ok" in reply and not reply["forbidden"], reply


def test_no_worker_or_keeper_outlives_the_zygote_users(zyg, scratch):
    workers = [zyg.spawn(submission=scratch, lab=LAB, forbidden=[]) for _ in range(3)]
    for w in workers:
        call(w, "ids")
    pids = [(w.pid, w.keeper) for w in workers]
    for w in workers:
        w.kill()
    for pid, keeper in pids:
        assert _gone(pid) and _gone(keeper)
    assert not children_of(zyg.pid) or all(_gone(p, 2) for p in children_of(zyg.pid))


def test_a_worker_whose_process_was_refused_is_reused(zyg, scratch):
    """The grading session replaces a worker that still has children when the next test
    starts; a worker that started nothing (a refused daemon included) is reused (no spawn
    cost)."""
    from grader.engine.student import Session, StudentError, StudentLab

    session = Session(zygote=zyg, submission_dir=scratch, forbidden={})
    lab = StudentLab(session, LAB)
    try:
        session.start_test(30)
        lab.call("ids")
        clean = session.workers[LAB]
        session.start_test(30)
        assert session.workers[LAB] is clean and clean.alive
        with pytest.raises(StudentError, match="PermissionError"):
            lab.call("daemon")
        session.start_test(30)      # the next test begins
        assert session.workers[LAB] is clean and clean.alive
        assert _processes_named("atkdaemon") == []
    finally:
        session.close()


def test_a_labs_worker_and_its_threads_end_when_the_next_lab_starts(zyg):
    """A thread that lab 1 started must not spin on through labs 2-4."""
    from grader.engine.student import Session, StudentLab

    spinner = b"import threading\n\ndef spin():\n    def loop():\n        while True:\n" \
              b"            pass\n    threading.Thread(target=loop, daemon=True).start()\n" \
              b"    return 1\n"
    scratch = make_scratch({"lab1_spin.py": spinner, "lab2_next.py": b"def one():\n    return 1\n"})
    session = Session(zygote=zyg, submission_dir=scratch.name, forbidden={})
    try:
        session.start_test(10, test="t1", lab="lab1_spin")
        assert StudentLab(session, "lab1_spin").call("spin") == 1
        first = session.workers["lab1_spin"]
        assert first.alive and os.path.exists(f"/proc/{first.pid}")
        session.start_test(10, test="t2", lab="lab2_next")
        assert not first.alive and "lab1_spin" not in session.workers
        assert StudentLab(session, "lab2_next").call("one") == 1
        assert _gone(first.pid)
    finally:
        session.close()
        scratch.cleanup()


FORGER = b'''
import os, stat, sys

def _channel():
    for fd in range(3, 256):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                return fd
        except OSError:
            pass

def forge_then(x):
    """An extra, well-formed reply goes first: later replies would be one call late."""
    os.write(_channel(), sys.modules["wire"].encode({"ok": "FORGED", "seq": 2}))
    return x

def echo(y):
    return y
'''
OVERFLOW = FORGER + b'''
# At import: a frame whose tensor's strides overflow (torch raises RuntimeError on it).
_h = b'{"ok": {"__tensor__": 0, "dtype": "float32", "shape": [0, 4611686018427387904, 4]}, "seq": 1}'
os.write(_channel(), sys.modules["wire"].PREFIX.pack(len(_h), 0) + _h)
'''


def test_a_frame_written_by_student_code_is_never_taken_for_another_reply(zyg):
    from grader.engine.student import Session, StudentError, StudentLab

    scratch = make_scratch({"lab1_forge.py": FORGER})
    session = Session(zygote=zyg, submission_dir=scratch.name, forbidden={})
    try:
        lab = StudentLab(session, "lab1_forge")
        session.start_test(10, test="t1", lab="lab1_forge")
        got = []
        for call in (("forge_then", 1), ("echo", 2), ("echo", 3)):
            try:
                got.append(lab.call(*call))
            except StudentError as exc:
                got.append(exc.kind)
                assert "wrote to the grader's channel" in exc.describe(hidden=False)
        # The forged frame answers nothing: each call's value is its own, or a crash.
        assert got[0] in (1, "crash") and "FORGED" not in got
        assert got[1] in (2, "crash") and got[2] in (3, "crash") and "crash" in got
    finally:
        session.close()
        scratch.cleanup()


def test_a_frame_that_cannot_be_decoded_ends_the_worker_not_the_grader(zyg):
    from grader.engine.student import Session

    scratch = make_scratch({"lab1_overflow.py": OVERFLOW})
    session = Session(zygote=zyg, submission_dir=scratch.name, forbidden={})
    try:
        session.start_test(10, test="t", lab="lab1_overflow")
        error = session.probe("lab1_overflow")       # the import writes the frame
        assert error is not None and error.kind == "crash", error
    finally:
        session.close()
        scratch.cleanup()


def test_wire_decode_fuzzed_raises_nothing_but_wire_error():
    """Frames a worker could send, mutated at random: decoding only ever gives a value or a
    WireError (never a RuntimeError, TypeError... in the trusted process)."""
    import json
    import random

    rng = random.Random(20261201)
    dims = [0, 1, 2, 3, 7, 2**31, 2**62, 2**63 - 1, -1]
    scalars = [None, True, 0, -1, 1.5, "x", [], {}, 2**64]

    def value(depth=0):
        roll = rng.random()
        if depth > 3 or roll < 0.3:
            return rng.choice(scalars)
        if roll < 0.55:
            return {"__tensor__": rng.choice([0, 1, -1, True, "0"]),
                    "dtype": rng.choice(["float32", "float64", "bool", "int64", "object", 5]),
                    "shape": [rng.choice(dims) for _ in range(rng.randint(0, 4))]}
        if roll < 0.7:
            return {rng.choice(["__tuple__", "__dict__", "__float__", "ok", "mro"]):
                    rng.choice([[value(depth + 1)], [[value(depth + 1), 1]], "nan", 5])}
        if roll < 0.85:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {"ok": value(depth + 1), "error": value(depth + 1)}

    for _ in range(3000):
        header = json.dumps(value()).encode()
        if rng.random() < 0.1:
            header = header[: rng.randint(0, len(header))]
        payload = bytearray(rng.randbytes(rng.choice([0, 8, 16, 24, 64])))
        with contextlib.suppress(wire.WireError):
            wire.decode(header, payload)


IPC_GRAB = b'''
import ctypes, os

def grab():
    """Memory that RLIMIT_AS does not count: SysV segments, queues, semaphores, memfds."""
    libc = ctypes.CDLL(None, use_errno=True)
    got = {}
    for name, call in (("shmget", lambda: libc.shmget(0, 512 << 20, 0o1600)),
                       ("msgget", lambda: libc.msgget(0, 0o1600)),
                       ("semget", lambda: libc.semget(0, 1, 0o1600))):
        rc = call()
        got[name] = "refused" if rc == -1 and ctypes.get_errno() == 1 else f"allowed ({rc})"
    try:
        os.close(os.memfd_create("x"))
        got["memfd_create"] = "allowed"
    except PermissionError:
        got["memfd_create"] = "refused"
    return got
'''


def _call_one_file_lab(zyg, lab: str, source: bytes, target: str):
    """``lab.target()`` in a fresh worker of a submission holding only ``source``."""
    scratch = make_scratch({f"{lab}.py": source})
    w = zyg.spawn(submission=scratch.name, lab=lab, forbidden=[])
    try:
        return call(w, target)
    finally:
        w.kill()
        scratch.cleanup()


def test_memory_that_rlimit_as_does_not_count_is_refused(zyg):
    """SysV IPC and memfds: refused by seccomp in every mode (a segment would count in no
    process's limit, and in plain mode would outlive the worker)."""
    got = _call_one_file_lab(zyg, "lab1_ipc", IPC_GRAB, "grab")
    assert got == {"shmget": "refused", "msgget": "refused", "semget": "refused",
                   "memfd_create": "refused"}, got


SPLICE_BYTES = b'''
import os

def splice():
    """Bytes moved without the kernel copying them from the caller's memory: between
    pipes (splice, tee), from a file (sendfile, copy_file_range)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    got = {}
    r, w = os.pipe()
    r2, w2 = os.pipe()
    src = os.open(__file__, os.O_RDONLY)
    for name, call in (("splice", lambda: os.splice(r, w2, 1)),
                       ("tee", lambda: libc.tee(r, w2, 1, 0)),
                       ("sendfile", lambda: os.sendfile(w2, src, 0, 1)),
                       ("copy_file_range", lambda: libc.copy_file_range(
                           src, None, src, None, 1, 0))):
        os.write(w, b"x")
        try:
            rc = call()
            if rc == -1:
                raise OSError(ctypes.get_errno(), "failed")
            got[name] = "allowed"
        except OSError as exc:      # seccomp refuses with EPERM
            got[name] = "refused" if exc.errno == 1 else f"failed ({exc.errno})"
    return got
'''


def test_pages_cannot_be_spliced_past_the_kernels_copy(zyg):
    """splice, tee, sendfile and copy_file_range are refused by seccomp: the relay takes
    off a worker's CPU time what copying its calls' bytes into its socket costs
    (engine.relay_cost), so no way of moving them may be cheaper than that copy."""
    got = _call_one_file_lab(zyg, "lab1_splice", SPLICE_BYTES, "splice")
    assert got == {"splice": "refused", "tee": "refused", "sendfile": "refused",
                   "copy_file_range": "refused"}, got


def test_two_zygotes_alive_on_one_machine_never_share_a_slot(scratch):
    """A slot is a sandbox's own uid as root, and RLIMIT_NPROC counts a uid's tasks over
    the whole machine: two graders on one machine (a TA's ``grader grade`` beside a batch,
    two batches) asking for the same slot shared one budget of 16 tasks, and a worker's
    thread could fail for what another grader's workers held. A zygote holds its slot
    while it lives: the second gets another, and the slot is free again after close."""
    first = Zygote(forbidden=FORBIDDEN, slot=SLOT, many_workers=False)
    second = Zygote(forbidden=FORBIDDEN, slot=SLOT, many_workers=False)
    try:
        first.start()
        second.start()
        # SLOT itself may be held by this module's other zygotes: the next free ones.
        assert SLOT <= first.slot < second.slot
        for z in (first, second):
            w = z.spawn(submission=scratch, lab=LAB, forbidden=[])
            try:
                assert call(w, "echo", torch.arange(2)).tolist() == [0, 1]
            finally:
                w.kill()
    finally:
        second.close()
        first.close()
    third = Zygote(forbidden=FORBIDDEN, slot=first.slot, many_workers=False)
    try:
        third.launch()
        assert third.slot == first.slot         # free again once its zygote closed
    finally:
        third.close()
