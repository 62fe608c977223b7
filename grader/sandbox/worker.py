"""The untrusted side: serve calls into a student's lab modules over one socket.

Runs in a forked, locked-down child of the zygote. It knows the student's files, the lab
under test and that lab's forbidden APIs; it never sees a reference, an expected value or a
test. Each request names a target in the lab module (a function, or a class to construct and
call) and carries the inputs; the reply carries plain values or the student's exception.
Imports only the stdlib, torch, ``wire`` and ``forbidden`` (loaded by path by the zygote).
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.util
import io
import os
import sys
import traceback

import torch

import forbidden
import wire

STDOUT_CAP = 4000
MESSAGE_CAP = 2000
LAB_MODULE_PREFIX = forbidden.LAB_MODULE_PREFIX
ForbiddenAPIError = forbidden.ForbiddenAPIError


class GradientError(RuntimeError):
    """The student's output is not connected to the inputs' autograd graph."""


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
            try:
                tree = ast.parse(source, filename)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                pass            # compiling the source below reports it, with its line
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


# --------------------------------------------------------------------------- requests

def _plain(value, depth=0):
    """Student return values reduced to wire-safe plain values."""
    if depth > 8:
        raise TypeError("return value nested too deeply")
    if isinstance(value, torch.Tensor):
        # A tensor subclass crosses as its plain data; the trusted side rebuilds a plain
        # torch.Tensor from bytes in any case.
        with torch._C.DisableTorchFunction():
            plain = torch.Tensor.as_subclass(value, torch.Tensor)
            return torch.Tensor.detach(plain).clone()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return tuple(_plain(v, depth + 1) for v in value)
    if isinstance(value, list):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    raise TypeError(f"returned a {type(value).__name__}, which is not a tensor, tuple or number")


def _flat_tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat_tensors(v)]
    return []


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


class Server:
    def __init__(self, sock, config):
        self.sock = sock
        self.lab = config["lab"]
        self.folder = config["folder"]
        self.stdout = CappedText()
        self.module = None
        self.import_error = None

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

    def handle(self, req: dict):
        module = self.lab_module()
        op = req["op"]
        if op == "probe":  # the names the contract requires that the module lacks
            return [str(n) for n in req.get("names", []) if not hasattr(module, str(n))]
        target = getattr(module, req["target"], None)
        if target is None:
            raise AttributeError(f"{self.lab}.py has no {req['target']}")
        torch.default_generator.manual_seed(int(req.get("seed", 0)))  # CPU only: ~100x cheaper than torch.manual_seed
        if req.get("ctor") is not None:
            obj = target(*req["ctor"]["args"], **req["ctor"]["kwargs"])
            if not isinstance(obj, torch.nn.Module):
                raise TypeError(f"{req['target']}(...) did not build an nn.Module")
            if req.get("dtype") in ("float32", "float64"):
                obj.to(getattr(torch, req["dtype"]))  # before loading: keep the weights' dtype
            if req.get("state_dict") is not None:
                obj.load_state_dict(req["state_dict"], strict=True)
            obj.train(bool(req.get("train", False)))
            torch.default_generator.manual_seed(int(req.get("seed", 0)))  # CPU only: ~100x cheaper than torch.manual_seed
            if op == "state_dict":
                return {k: v for k, v in obj.state_dict().items()}
            if op == "buffer":
                buffers = dict(obj.named_buffers())
                if req["name"] not in buffers:
                    raise AttributeError(f"{req['target']} has no buffer named {req['name']!r}")
                return buffers[req["name"]]
            fn = obj
        else:
            obj, fn = None, target
        args, kwargs = list(req["args"]), dict(req["kwargs"])
        if op == "call":
            return _plain(fn(*args, **kwargs))
        if op == "grad":
            return self.grad(fn, obj, args, kwargs, req["grad_outputs"])
        raise ValueError(f"unknown op {op!r}")

    def grad(self, fn, module, args, kwargs, grad_outputs):
        leaves = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                args[i] = a.clone().requires_grad_(True)
                leaves.append(args[i])
            else:
                leaves.append(None)
        output = fn(*args, **kwargs)
        outs = _flat_tensors(output)
        pairs = [(o, g) for o, g in zip(outs, grad_outputs) if g is not None]
        if not pairs:
            raise GradientError("there is no output to differentiate")
        loss = sum((o * g.to(o.dtype)).sum() for o, g in pairs)
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise GradientError(
                "the output does not depend on the inputs through autograd "
                "(was something detached, or computed with numpy / .item()?)"
            )
        loss.backward()
        params = {}
        if module is not None:
            params = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
        return {
            "output": _plain(output),
            "input_grads": tuple(None if t is None else t.grad for t in leaves),
            "param_grads": {k: v.detach().clone() for k, v in params.items()},
        }

    def serve(self):
        while True:
            try:
                req = wire.recv_frame(self.sock)
            except wire.PeerClosed:
                return
            self.stdout.take()
            try:
                reply = {"ok": self.handle(req)}
            except _ImportFailed:
                reply = {"error": self.import_error}
            except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt too
                reply = {"error": describe_exception(exc, self.folder)}
            reply["stdout"] = self.stdout.take()
            reply["forbidden"] = forbidden.take_violations()
            try:
                frame = wire.encode(reply)
            except BaseException as exc:  # noqa: BLE001 - an unencodable student value
                frame = wire.encode({"error": describe_exception(exc, self.folder),
                                     "stdout": reply["stdout"],
                                     "forbidden": reply["forbidden"]})
            self.sock.sendall(frame)


class _ImportFailed(Exception):
    pass


def serve(sock, config, bindings) -> None:
    """Entry point in the locked-down worker: guard, then answer requests until EOF."""
    server = Server(sock, config)
    sys.stdout = sys.stderr = server.stdout
    sys.path[:] = [p for p in sys.path if p and p != "."]  # never the cwd
    forbidden.install(config["lab"], config["forbidden"], bindings)
    # Lab modules come only from the submission folder, ahead of every other finder.
    sys.meta_path.insert(0, LabFinder(config["folder"], config["lab"], config["forbidden"]))
    server.serve()
