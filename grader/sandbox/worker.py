"""The untrusted side: serve calls into a student's lab modules over one socket.

Runs in a forked, locked-down child of the zygote. It knows the student's files, the lab
under test and that lab's forbidden APIs; it never sees a reference, an expected value or a
test. Each request names a target in the lab module (a function, or a class to construct and
call) and carries the inputs; the reply carries plain values or the student's exception.
Requests are answered by ``protocol`` (the trusted replay of ``grader.mistakes`` answers them
with the same code). Imports only the stdlib, torch, ``wire``, ``forbidden`` and ``protocol``
(loaded by path by the zygote).
"""

from __future__ import annotations

import ast
import contextlib
import errno
import importlib
import importlib.abc
import importlib.util
import io
import os
import re
import sys
import time
import traceback

import torch

import forbidden
import jail
import protocol
import wire

STDOUT_CAP = 4000
MESSAGE_CAP = 2000
LAB_MODULE_PREFIX = forbidden.LAB_MODULE_PREFIX
LAB_NAME = re.compile(r"lab\d+_\w+")    # a lab's module (rubric.LAB_NAME_RE)
MAX_LIBRARY_IMPORTS = 64      # names imported ahead of a measured call (see import_libraries)
ForbiddenAPIError = forbidden.ForbiddenAPIError


# --------------------------------------------------------------------------- student modules

class LabFinder(importlib.abc.MetaPathFinder):
    """Imports lab modules only from the submission folder, checking each for forbidden APIs."""

    def __init__(self, folder: str, lab: str, forbidden):
        self.folder, self.lab, self.forbidden = folder, lab, list(forbidden)

    def find_spec(self, fullname, path=None, target=None):
        if "." in fullname or not fullname.startswith(LAB_MODULE_PREFIX):
            return None
        filename = os.path.join(self.folder, fullname + ".py")
        if not os.path.isfile(filename):
            return None
        return importlib.util.spec_from_file_location(fullname, filename, loader=LabLoader(self))


class LabLoader(importlib.abc.Loader):
    def __init__(self, finder: LabFinder):
        self.finder = finder

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        filename = module.__spec__.origin
        with open(filename, "rb") as fh:
            raw = fh.read()
        # UnicodeDecodeError is reported like an import error; a UTF-8 BOM is allowed.
        source = raw.decode("utf-8-sig")
        tree = None
        if self.finder.forbidden:
            # Parsed once: for the scan, then compiled from the tree.
            # A file that does not parse: compiling the source below reports it, with its line.
            with contextlib.suppress(SyntaxError, ValueError, RecursionError, MemoryError):
                tree = ast.parse(source, filename)
        problems = (forbidden.static_violations(tree, filename, self.finder.forbidden)
                    if tree is not None else [])
        for problem in problems:
            forbidden._state["violations"].append(problem.rsplit("uses ", 1)[-1])
        if problems:
            raise ForbiddenAPIError(
                f"{self.finder.lab} may not use: " + "; ".join(problems[:5])
            )
        code = compile(tree if tree is not None else source, filename, "exec",
                       dont_inherit=True)
        exec(code, module.__dict__)


def describe_exception(exc: BaseException, folder: str) -> dict:
    """The student's exception as plain text: type, base names, message, their own frames.

    Student code controls the exception (its class, ``__str__``, even ``__mro__`` names), so
    every step is guarded: whatever it does, a plain dict comes out.
    """
    def text(fn, default):
        try:
            value = fn()
            return value if isinstance(value, str) else default
        except BaseException:  # noqa: BLE001 - a __str__ that raises SystemExit, say
            return default

    frames = []
    try:
        for fs in traceback.extract_tb(exc.__traceback__):
            if str(fs.filename).startswith(folder + os.sep):
                frames.append(f"{os.path.basename(fs.filename)}:{fs.lineno} in {fs.name}")
    except BaseException:  # noqa: BLE001
        frames = []
    where = frames[-1] if frames else ""
    if isinstance(exc, SyntaxError):
        filename = text(lambda: exc.filename, "")
        if filename.startswith(folder):
            where = f"{os.path.basename(filename)}:{text(lambda: str(exc.lineno), '?')}"
    mro = []
    try:
        mro = [text(lambda c=c: c.__name__, "?") for c in type(exc).__mro__]
    except BaseException:  # noqa: BLE001
        mro = ["BaseException"]
    return {
        "type": text(lambda: type(exc).__name__, "Exception"),
        "mro": mro,
        "message": text(lambda: str(exc), "<the exception's message could not be shown>")[
            :MESSAGE_CAP],
        "where": where,
        "frames": frames[-8:],
    }


class CappedText(io.TextIOBase):
    """sys.stdout for student code: keeps the first STDOUT_CAP characters of each call."""

    def __init__(self):
        self.parts, self.size = [], 0

    def writable(self):
        return True

    def write(self, text):
        text = str(text)
        if self.size < STDOUT_CAP:
            self.parts.append(text[: STDOUT_CAP - self.size])
            self.size += len(self.parts[-1])
        return len(text)

    def take(self) -> str:
        out = "".join(self.parts)
        self.parts, self.size = [], 0
        return out


class LabImports(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The other labs a lab may import, and nothing else of them ("Importing another lab").

    ``importable``: earlier lab -> its contract functions (``Rubric.importable``). An import
    of any other lab module (a later lab, a lab offering nothing) fails, and so does any
    name not in the list, with a message naming what this lab may import. ``answered_by``:
    "reference" (while graded): each name is a stub that sends the call to the grader, which
    has the course's reference answer it in a reference worker of its own (protocol
    "Callbacks"); "own": the lab's own file in the submission folder answers (a student's
    check without the reference, cumulative grading, the reference worker itself), seen
    through the same list of names.
    """

    def __init__(self, server: "Server", lab: str, importable: dict, answered_by: str,
                 finder: "LabFinder"):
        self.server, self.lab, self.answered_by, self.finder = server, lab, answered_by, finder
        self.importable = {str(k): [str(n) for n in v] for k, v in importable.items()}

    def offer(self) -> str:
        """What this lab may import, as a sentence."""
        names = [f"{other}.{name}" for other, names in self.importable.items()
                 for name in names]
        return (f"{self.lab} may import only the contract functions of earlier labs: "
                + (", ".join(names) if names else "nothing (no earlier lab offers any)")
                + " (docs/LAB_CONTRACT.md, \"Importing another lab\")")

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if not top.startswith(LAB_MODULE_PREFIX) or top == self.lab:
            return None
        if fullname in self.importable:
            return importlib.util.spec_from_loader(fullname, self)
        if not LAB_NAME.fullmatch(top):
            return None                 # not a lab's name: LabFinder's (or nobody's)
        raise ImportError(f"{self.lab} may not import {fullname}: " + self.offer(), name=fullname)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        other, names, offer = module.__name__, self.importable[module.__name__], self.offer()

        def missing(name):
            if name.startswith("__"):
                raise AttributeError(name)
            # An ImportError (not AttributeError) reaches ``from X import name`` as it is.
            raise ImportError(f"{self.lab} may not import {other}.{name}: {offer}",
                              name=other)

        module.__getattr__ = missing
        if self.answered_by == "reference":
            module.__doc__ = ("The course's reference answers these calls while this lab is "
                              "graded: your own file of this lab is graded on its own.")
            for name in names:
                setattr(module, name, _proxy(self.server, other, name))
            return
        spec = self.finder.find_spec(other)
        if spec is None:
            raise ModuleNotFoundError(f"{self.lab} imports {other}, and there is no "
                                      f"{other}.py beside it", name=other)
        own = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(own)
        module.__doc__ = own.__doc__
        for name in names:
            if hasattr(own, name):
                setattr(module, name, getattr(own, name))


def _proxy(server: "Server", lab: str, target: str):
    def call(*args, **kwargs):
        # Drawn from the worker's generator (seeded per request): deterministic, and the
        # backward pass replays the same dropout mask.
        seed = int(torch.randint(0, 2**31 - 1, (1,)))
        args, kwargs = list(args), dict(kwargs)
        where = protocol.callback_leaves(args, kwargs)
        leaves = [args[k] if kind == "arg" else kwargs[k] for kind, k in where]
        if not (torch.is_grad_enabled() and any(t.requires_grad for t in leaves)):
            return server.callback(protocol.callback_request(lab, target, args, kwargs, seed))
        shape = {}
        outputs = _Remote.apply(server, lab, target, args, kwargs, seed, shape, *leaves)
        return _rebuild(shape["value"], iter(outputs))

    call.__name__ = call.__qualname__ = target
    call.__doc__ = f"{lab}.{target}, answered by the course's reference while grading."
    call.__module__ = lab
    return call


class _Remote(torch.autograd.Function):
    """A proxy call that gradients flow through (forward and backward by callback)."""

    @staticmethod
    def forward(ctx, server, lab, target, args, kwargs, seed, shape, *leaves):
        value = server.callback(protocol.callback_request(lab, target, args, kwargs, seed))
        shape["value"] = value
        ctx.call = (server, lab, target, args, kwargs, seed)
        return tuple(protocol.flat_tensors(value))

    @staticmethod
    def backward(ctx, *grad_outputs):
        server, lab, target, args, kwargs, seed = ctx.call
        reply = server.callback(protocol.callback_request(lab, target, args, kwargs, seed,
                                                          grad_outputs=grad_outputs))
        grads = reply.get("grads") if isinstance(reply, dict) else None
        if not isinstance(grads, list):
            raise RuntimeError(f"{lab}.{target}: no gradients came back")
        return (None,) * 7 + tuple(grads)


def _rebuild(value, tensors):
    """``value`` with its tensors, depth first, replaced by the next of ``tensors``."""
    if isinstance(value, torch.Tensor):
        return next(tensors)
    if isinstance(value, (tuple, list)):
        return type(value)(_rebuild(v, tensors) for v in value)
    return value


class Server:
    def __init__(self, sock, config):
        self.sock = sock
        self.lab = config["lab"]
        self.folder = config["folder"]
        self.stdout = CappedText()
        self.module = None
        self.import_error = None
        self.queued: list = []          # requests read while waiting for a callback reply
        self.seq = 0                    # requests taken so far; each reply carries its number
        self.mapped = False             # jail.map_large_allocations() done
        self.answer_cpu_ns = None       # a reference call's own CPU time (see handle)
        # What the grader adds to this worker's CPU time for its callbacks: what the
        # answers took, less what it takes off for the worker's framing of them.
        self.answers_cpu_ns = 0

    def callback(self, req: dict):
        """Ask the grader for another lab's answer (protocol "Callbacks"); its value. No
        count of calls: what the answers cost is bounded (and charged) by the grader."""
        name = f"{req['lab']}.{req['target']}"
        # Plain tensors only (no subclass, no graph): what else is in the call is named.
        # Detached views, not copies: the frame is sent from the tensors' own memory.
        req = protocol.plain(req, what=f"{name} was given", copy=False)
        wire.send_parts(self.sock, wire.encode_parts({"callback": req}))
        del req
        while True:
            frame = wire.recv_frame(self.sock)
            if isinstance(frame, dict) and "callback_reply" in frame:
                break
            self.queued.append(frame)   # a request sent ahead: answered after this one
        reply = frame["callback_reply"]
        for key, sign in (("cpu_ns", 1), ("framing_ns", -1)):
            told = reply.get(key) if isinstance(reply, dict) else None
            if type(told) is int and told > 0:
                self.answers_cpu_ns += sign * told
        if not isinstance(reply, dict) or "ok" not in reply:
            error = reply.get("error") if isinstance(reply, dict) else None
            raise RuntimeError(f"{name} (answered by the course's reference while "
                               f"{self.lab} is graded): {error}")
        return reply["ok"]

    def lab_module(self):
        if self.module is None and self.import_error is None:
            try:
                self.module = importlib.import_module(self.lab)
            except BaseException as exc:  # noqa: BLE001 - reported to the grader as text
                self.import_error = describe_exception(exc, self.folder)
                self.import_error["import_failed"] = True
        if self.import_error is not None:
            raise _ImportFailed()
        return self.module

    def import_libraries(self) -> None:
        """Import the installed packages the lab file names (``import matplotlib.pyplot``),
        not the lab itself, before a measured call's baseline.

        The lab module is imported after the baseline, so that memory its own code touches
        at import (an arena the call then reuses) counts in the call's peak. The libraries it
        imports are not the student's memory: a correct lab that imports matplotlib would
        otherwise carry its ~30 MB. Only names that the lab finders do not serve (never a
        lab module, never a relative import), through the same import guards; a name that
        fails to import fails again, the same way, when the lab imports it, and the
        forbidden names it reached here are forgotten (a function-level import might never
        run)."""
        try:
            with open(os.path.join(self.folder, self.lab + ".py"), "rb") as fh:
                tree = ast.parse(fh.read().decode("utf-8-sig"))
        except (OSError, ValueError, SyntaxError, RecursionError, MemoryError):
            return
        names = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.append(node.module)
                names += [f"{node.module}.{alias.name}" for alias in node.names
                          if alias.name != "*"]
        kept = forbidden.take_violations()
        try:
            for name in list(dict.fromkeys(names))[:MAX_LIBRARY_IMPORTS]:
                if name.split(".")[0].startswith(LAB_MODULE_PREFIX) or name in sys.modules:
                    continue
                try:
                    importlib.import_module(name)
                except Exception:  # noqa: BLE001, S112 - the lab's own import reports it
                    continue
        finally:
            forbidden.take_violations()
            forbidden._state["violations"].extend(kept)

    def calibrate(self, calls: int, request_bytes: int) -> None:
        """``calls`` callbacks the cheapest way (protocol ``calibrate_request``): the grader
        times them from outside, before any student code is in this process."""
        if self.module is not None or self.import_error is not None:
            raise RuntimeError("a calibration after the lab's import is not the grader's")
        frame = wire.encode({"callback": protocol.callback_request(
            protocol.CALIBRATION_LAB, "echo",
            [torch.zeros(max(0, request_bytes), dtype=torch.uint8)], {}, 0)})
        buffer = bytearray(0)
        for _ in range(max(0, calls)):
            self.sock.sendall(frame)
            buffer = wire.recv_frame_into(self.sock, buffer)

    def handle(self, req: dict):
        if req["op"] == protocol.CALIBRATE:     # before the lab is imported (see there)
            return self.calibrate(int(req["calls"]), int(req["request_bytes"]))
        if req["op"] == "prepare":  # a measured worker, before the lab is imported
            # No student code has run in this worker yet, so nothing it touched (an arena
            # faulted in at import, say) is in the baseline the grader reads after this.
            self.import_libraries()             # their memory is not the lab's (see there)
            jail.map_large_allocations()        # resident peak == memory held (see there)
            jail.populate_mapped_files()        # library pages into the baseline (see there)
            return None
        module = self.lab_module()
        if req["op"] == protocol.REFERENCE_CALL:    # a reference worker (see protocol)
            if not self.mapped:
                # Its big blocks are returned when freed: a burst of calls does not leave
                # it holding a heap of old replies (#25), and what a measured call has it
                # fault in is what it held.
                self.mapped = jail.map_large_allocations() or True
            call = req.get("call")
            target = call.get("target") if isinstance(call, dict) else None
            fn = getattr(module, target, None) if isinstance(target, str) else None
            if not callable(fn) or target.startswith("_"):
                raise AttributeError(f"{self.lab}.py has no function {target!r}")
            # The CPU time of the answer itself (every thread of this process), reported
            # with it: a measured call is charged this, not the relay's framing (#25).
            started = time.process_time_ns()
            value = protocol.answer_callback(fn, call)
            self.answer_cpu_ns = time.process_time_ns() - started
            return value
        if req["op"] == "probe":  # the names the contract requires that the module lacks
            return [str(n) for n in req.get("names", []) if not hasattr(module, str(n))]
        return protocol.answer(lambda name: getattr(module, name, None), req, f"{self.lab}.py")

    def serve(self):
        while True:
            try:
                req = self.queued.pop(0) if self.queued else wire.recv_frame(self.sock)
            except wire.PeerClosed:
                return
            self.stdout.take()
            self.seq += 1
            try:
                reply = {"ok": self.handle(req)}
            except _ImportFailed:
                reply = {"error": self.import_error}
            except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt too
                reply = {"error": describe_exception(exc, self.folder)}
            reply["stdout"] = self.stdout.take()
            reply["forbidden"] = forbidden.take_violations()
            if self.answer_cpu_ns is not None:
                reply["cpu_ns"], self.answer_cpu_ns = self.answer_cpu_ns, None
            reply["seq"] = self.seq
            try:
                frame = wire.encode(reply)
            except BaseException as exc:  # noqa: BLE001 - an unencodable student value
                frame = wire.encode({"error": describe_exception(exc, self.folder),
                                     "stdout": reply["stdout"],
                                     "forbidden": reply["forbidden"], "seq": self.seq})
            # Nothing of this request is held once its reply is out (the grader reads a
            # measured worker's memory as soon as the reply arrives): a warm-up call leaves
            # held only what the lab's code kept, never its own inputs.
            req = reply = None
            self.sock.sendall(frame)
            frame = None


class _ImportFailed(Exception):
    pass


def _clock_counts_answers(server: Server) -> None:
    """``time.process_time`` (and ``_ns``) in this worker count, besides its own CPU time,
    what the course's reference took to answer its calls into other labs: the grader
    charges that to the test too (a training's budget), so a student who stops by the
    contract's clock stops within what they are charged."""
    own_s, own_ns = time.process_time, time.process_time_ns

    def process_time() -> float:
        return own_s() + server.answers_cpu_ns / 1e9

    def process_time_ns() -> int:
        return own_ns() + server.answers_cpu_ns

    process_time.__doc__ = ("Process CPU time (s), with what the course's reference took "
                            "to answer this process's calls into other labs.")
    process_time_ns.__doc__ = "process_time() in nanoseconds."
    time.process_time, time.process_time_ns = process_time, process_time_ns


# The audit events of every stdlib route to another process (multiprocessing and a
# DataLoader with workers go through os.fork or subprocess; on Windows _winapi).
PROCESS_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
    "os.startfile", "subprocess.Popen", "_posixsubprocess.fork_exec", "_winapi.CreateProcess",
    "pty.spawn",
})
NO_PROCESS = ("a lab's code runs in this one process: the sandbox starts no other (its "
              "work would not be in what the grader measures). Compute here: no os.fork, "
              "multiprocessing, subprocess, or DataLoader(num_workers > 0)")


def refuse_new_processes() -> None:
    """From here on, starting a process raises PermissionError (EPERM, as the kernel's own
    refusal: code that falls back on OSError still works) whose words say why. In the jail
    seccomp refuses it too, by any route; the portable backend has only this (a child
    started through ctypes there is still ended with the worker: ``portable.kill_tree``).
    An audit hook cannot be removed."""
    def hook(event, args):
        if event in PROCESS_EVENTS:
            raise PermissionError(errno.EPERM, f"{NO_PROCESS} ({event})")

    sys.addaudithook(hook)


def serve(sock, config, bindings) -> None:
    """Entry point in the locked-down worker: guard, then answer requests until EOF."""
    server = Server(sock, config)
    if config.get("answered_by") == "reference":
        _clock_counts_answers(server)
    sys.stdout = sys.stderr = server.stdout
    sys.path[:] = [p for p in sys.path if p and p != "."]  # never the cwd
    forbidden.install(config["lab"], config["forbidden"], bindings)
    refuse_new_processes()
    # Lab modules come only from the submission folder, ahead of every other finder; which
    # other labs (and names) this lab may import is decided ahead of those (LabImports).
    finder = LabFinder(config["folder"], config["lab"], config["forbidden"])
    sys.meta_path.insert(0, finder)
    sys.meta_path.insert(0, LabImports(server, config["lab"], config.get("importable") or {},
                                       config.get("answered_by") or "own", finder))
    server.serve()
