"""The untrusted side: serve calls into a student's lab modules over one socket.

Runs in a forked, locked-down child of the zygote. It knows the student's files, the lab
under test and that lab's forbidden APIs; it never sees a reference, an expected value or a
test. Each request names a target in the lab module (a function, or a class to construct and
call) and carries the inputs; the reply carries plain values or the student's exception.
Imports only the stdlib, torch and ``wire`` (loaded by path by the zygote).
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.util
import io
import os
import sys
import traceback

import torch

import wire

LAB_MODULE_PREFIX = "lab"
STDOUT_CAP = 4000
MESSAGE_CAP = 2000

# Private entry points that do the same work as a forbidden public API; blocked with it.
ALIASES = {
    "torch.nn.functional.scaled_dot_product_attention": [
        "torch._C._nn.scaled_dot_product_attention",
        "torch.ops.aten.scaled_dot_product_attention",
        "torch.ops.aten._scaled_dot_product_attention_math",
        "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu",
        "torch.ops.aten._scaled_dot_product_efficient_attention",
        "torch.ops.aten._scaled_dot_product_flash_attention",
        "torch.ops.aten._scaled_dot_product_cudnn_attention",
        "torch.ops.aten._fused_sdp_choice",
    ],
    "torch.nn.functional.multi_head_attention_forward": [
        "torch.ops.aten._native_multi_head_attention",
        "torch._native_multi_head_attention",
    ],
    "torch.nn.TransformerEncoderLayer": ["torch.ops.aten._transformer_encoder_layer_fwd"],
}


class ForbiddenAPIError(RuntimeError):
    """Raised in the worker when student code reaches an API its lab may not use."""


class GradientError(RuntimeError):
    """The student's output is not connected to the inputs' autograd graph."""


# --------------------------------------------------------------------------- forbidden APIs

def _resolve(dotted: str):
    parts = dotted.split(".")
    obj = sys.modules.get(parts[0]) or __import__(parts[0])
    for part in parts[1:]:
        obj = getattr(obj, part)
    return obj


def index_bindings(names) -> dict[str, list[tuple[str, str]]]:
    """For each dotted name, every (module, attribute) in sys.modules bound to that object.

    Done once in the zygote so that a worker can replace every alias of a forbidden
    function (``torch._C._nn.x`` is ``torch.nn.functional.x``) without scanning modules.
    """
    targets = {}
    for name in names:
        for alias in [name, *ALIASES.get(name, [])]:
            try:
                targets[id(_resolve(alias))] = name
            except Exception:
                continue
    found: dict[str, list[tuple[str, str]]] = {name: [] for name in names}
    for modname, module in list(sys.modules.items()):
        try:
            attrs = vars(module)
        except TypeError:
            continue
        for attr, value in list(attrs.items()):
            name = targets.get(id(value))
            if name is not None:
                found[name].append((modname, attr))
    return found


def install_guards(lab: str, forbidden, bindings) -> None:
    """Make every forbidden API raise ForbiddenAPIError when called in this worker."""

    def guard_for(name):
        def forbidden_api(*args, **kwargs):
            raise ForbiddenAPIError(f"{lab} may not use {name} (see the lab's rules)")

        forbidden_api.__name__ = name.rsplit(".", 1)[-1]
        return forbidden_api

    for name in forbidden:
        guard = guard_for(name)
        try:
            obj = _resolve(name)
        except Exception:
            continue
        if isinstance(obj, type):
            # Classes stay importable (type checks, subclassing) but cannot be built or run.
            def blocked(self, *args, _name=name, **kwargs):
                raise ForbiddenAPIError(f"{lab} may not use {_name} (see the lab's rules)")

            obj.__init__ = blocked
            obj.forward = blocked
            obj.__call__ = blocked
        for modname, attr in bindings.get(name, []):
            module = sys.modules.get(modname)
            if module is not None and not isinstance(obj, type):
                setattr(module, attr, guard)
        for alias in ALIASES.get(name, []):
            head, _, leaf = alias.rpartition(".")
            try:
                setattr(_resolve(head), leaf, guard)
            except Exception:
                pass


def static_violations(source: str, filename: str, forbidden) -> list[str]:
    """Forbidden APIs named in the source: ``F.x``, ``from torch... import x``, reload()."""
    leaves = {}
    for name in forbidden:
        for alias in [name, *ALIASES.get(name, [])]:
            leaves[alias.rsplit(".", 1)[-1]] = name
    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []  # the import itself reports the syntax error
    lab_aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(LAB_MODULE_PREFIX):
                    lab_aliases.add((a.asname or a.name).split(".")[0])
    found = []
    for node in ast.walk(tree):
        hit = None
        if isinstance(node, ast.Attribute) and node.attr in leaves:
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if not (isinstance(root, ast.Name) and root.id in lab_aliases | {"self"}):
                hit = leaves[node.attr]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for a in node.names:
                if a.name in leaves:
                    hit = leaves[a.name]
        elif isinstance(node, (ast.Name, ast.Attribute)) and (
            getattr(node, "id", None) == "reload" or getattr(node, "attr", None) == "reload"
        ):
            hit = "importlib.reload (it would rebuild blocked APIs)"
        if hit:
            found.append(f"{os.path.basename(filename)}:{node.lineno}: uses {hit}")
    return found


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
        source = raw.decode("utf-8")  # UnicodeDecodeError is reported like an import error
        problems = static_violations(source, filename, self.finder.forbidden)
        if problems:
            raise ForbiddenAPIError(
                f"{self.finder.lab} may not use: " + "; ".join(problems[:5])
            )
        code = compile(source, filename, "exec", dont_inherit=True)
        exec(code, module.__dict__)


def describe_exception(exc: BaseException, folder: str) -> dict:
    """The student's exception as plain text: type, base names, message, their own frames."""
    frames = []
    for fs in traceback.extract_tb(exc.__traceback__):
        if fs.filename.startswith(folder + os.sep):
            frames.append(f"{os.path.basename(fs.filename)}:{fs.lineno} in {fs.name}")
    where = frames[-1] if frames else ""
    if isinstance(exc, SyntaxError) and exc.filename and exc.filename.startswith(folder):
        where = f"{os.path.basename(exc.filename)}:{exc.lineno}"
    try:
        message = str(exc)
    except Exception:
        message = "<the exception's message could not be shown>"
    return {
        "type": type(exc).__name__,
        "mro": [c.__name__ for c in type(exc).__mro__],
        "message": message[:MESSAGE_CAP],
        "where": where,
        "frames": frames[-8:],
    }


# --------------------------------------------------------------------------- requests

def _plain(value, depth=0):
    """Student return values reduced to wire-safe plain values."""
    if depth > 8:
        raise TypeError("return value nested too deeply")
    if isinstance(value, torch.Tensor):
        return torch.Tensor.detach(value).clone()
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
        if op == "probe":
            return True
        target = getattr(module, req["target"], None)
        if target is None:
            raise AttributeError(f"{self.lab}.py has no {req['target']}")
        torch.manual_seed(req.get("seed", 0))
        if req.get("ctor") is not None:
            obj = target(*req["ctor"]["args"], **req["ctor"]["kwargs"])
            if not isinstance(obj, torch.nn.Module):
                raise TypeError(f"{req['target']}(...) did not build an nn.Module")
            if req.get("state_dict") is not None:
                obj.load_state_dict(req["state_dict"], strict=True)
            obj.train(bool(req.get("train", False)))
            torch.manual_seed(req.get("seed", 0))
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
            try:
                frame = wire.encode(reply)
            except Exception as exc:  # noqa: BLE001 - an unencodable student value
                frame = wire.encode({"error": describe_exception(exc, self.folder),
                                     "stdout": reply["stdout"]})
            self.sock.sendall(frame)


class _ImportFailed(Exception):
    pass


def serve(sock, config, bindings) -> None:
    """Entry point in the locked-down worker: guard, then answer requests until EOF."""
    server = Server(sock, config)
    sys.stdout = sys.stderr = server.stdout
    sys.meta_path.insert(0, LabFinder(config["folder"], config["lab"], config["forbidden"]))
    sys.path[:] = [p for p in sys.path if p]  # never the cwd
    install_guards(config["lab"], config["forbidden"], bindings)
    server.serve()
