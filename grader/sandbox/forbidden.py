"""Forbidden APIs (docs/LAB_CONTRACT.md, "What each lab may not call"), enforced in a worker.

Four layers, all inside the worker, for the lab under test only:

1. the dispatcher: every ATen operator that implements a forbidden API (for
   ``scaled_dot_product_attention``: the public op and all its fused and math kernels) gets a
   kernel that raises, so no Python alias, ``torch.ops.aten...``, ``torch._C._nn...``,
   TorchScript, ``torch._C._jit_get_operation`` or object found with ``gc`` reaches it;
2. Python code: a forbidden Python function (``multi_head_attention_forward``) and every
   method of a forbidden class (``nn.MultiheadAttention``) has its ``__code__`` replaced in
   place, so every reference to it, however obtained, runs the guard; builtins and other
   callables found under the forbidden names are replaced where the zygote indexed them;
3. imports: a module that is already loaded may not be loaded again (``importlib.reload``,
   ``del sys.modules[...]``), and modules that only exist to provide a forbidden API
   (``torch.nn.attention.flex_attention``) may not be imported;
4. a static scan of the student's file at import time, so a violation is reported by name
   even when the call would sit in an untested branch.

Every guard that fires is recorded; the worker reports the names with the reply, so a
student who catches the exception still gets the call marked as a violation.

This is in-process enforcement: it stops the names, aliases and reflection tricks above. It
cannot stop a student who copies PyTorch's source into their file, or who calls into
libtorch through ``ctypes``; docs/security.md says so.

Imported by path in the zygote and the worker: stdlib and torch only.
"""

from __future__ import annotations

import ast
import builtins
import ctypes
import importlib.abc
import importlib.machinery
import os
import sys
import warnings

import torch
import contextlib

LAB_MODULE_PREFIX = "lab"

# Other Python-level names of the same API.
ALIASES = {
    "torch.nn.functional.scaled_dot_product_attention": [
        "torch._C._nn.scaled_dot_product_attention",
        "torch._decomp.decompositions.scaled_dot_product_flash_attention_for_cpu",
        "torch._higher_order_ops.flex_attention.math_attention",
        "torch._higher_order_ops.flex_attention.sdpa_dense",
    ],
    "torch.nn.functional.multi_head_attention_forward": [],
    "torch.nn.MultiheadAttention": [],
    "torch.nn.TransformerEncoderLayer": [],
    "torch.nn.TransformerEncoder": [],
    "torch.nn.Transformer": [],
}
# Substrings of attribute names (in torch's own modules) and of ATen operator names that
# belong to the API. Matching is by substring; a pattern never matches student code.
PATTERNS = {
    "torch.nn.functional.scaled_dot_product_attention": [
        "scaled_dot_product", "scaled_dot_attention", "flex_attention", "_fused_sdp_choice"],
    "torch.nn.functional.multi_head_attention_forward": ["multi_head_attention"],
    "torch.nn.MultiheadAttention": ["multi_head_attention", "MultiheadAttention"],
    "torch.nn.TransformerEncoderLayer": ["transformer_encoder_layer", "TransformerEncoderLayer"],
    "torch.nn.TransformerEncoder": ["transformer_encoder_layer", "TransformerEncoder"],
    "torch.nn.Transformer": [],
}
BLOCKED_MODULES = {
    "torch.nn.functional.scaled_dot_product_attention": [
        "torch.nn.attention.flex_attention", "torch._higher_order_ops.flex_attention"],
}
_incref = ctypes.pythonapi.Py_IncRef   # looked up once, in the zygote
# Keys whose kernels compute (an op with only an Autograd kernel has nothing to run on CPU).
_KERNEL_KEYS = ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CPU")


class ForbiddenAPIError(RuntimeError):
    """Raised in the worker when student code reaches an API its lab may not use."""


_state = {"lab": "", "violations": []}


def _fire(name: str):
    if name not in _state["violations"]:
        _state["violations"].append(name)
    raise ForbiddenAPIError(f"{_state['lab'] or 'this lab'} may not use {name} "
                            "(see the lab's rules)")


def take_violations() -> list[str]:
    """The forbidden names reached since the last call (and forget them)."""
    out = list(_state["violations"])
    _state["violations"].clear()
    return out


def _patterns(name: str) -> list[str]:
    return PATTERNS.get(name, [])


def _leaves(names) -> dict[str, str]:
    out = {}
    for name in names:
        for alias in [name, *ALIASES.get(name, [])]:
            out[alias.rsplit(".", 1)[-1]] = name
    return out


def _resolve(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is not None:
            obj = module
            for part in parts[i:]:
                obj = getattr(obj, part)
            return obj
    obj = __import__(parts[0])
    for part in parts[1:]:
        obj = getattr(obj, part)
    return obj


# --------------------------------------------------------------------------- zygote side

class Plan:
    """What a worker does to guard each name, worked out once in the zygote.

    A forked worker pays for every page it writes (copy-on-write), so it must not walk
    ``sys.modules`` or class dictionaries itself: it only swaps the listed functions' code,
    replaces the listed bindings and registers the listed kernels.
    """

    def __init__(self):
        self.functions: dict[str, list] = {}              # name -> Python functions
        self.bindings: dict[str, list[tuple[object, str]]] = {}   # name -> (module, attr)
        self.kernels: list[tuple[str, str, str]] = []      # (operator, key, name)
        self.loaded: frozenset[str] = frozenset()
        self.codes: dict = {}                              # (name, freevars) -> code


def index_bindings(names) -> Plan:
    """The plan for ``names``: every object, binding and ATen kernel of each API.

    An attribute of one of torch's loaded modules belongs to an API when its value is the
    API's object (or an alias's) or its name contains one of the API's patterns.
    """
    plan = Plan()
    names = list(names)
    targets = {}
    for name in names:
        plan.functions[name] = []
        plan.bindings[name] = []
        for alias in [name, *ALIASES.get(name, [])]:
            try:
                obj = _resolve(alias)
            except Exception:  # noqa: BLE001 - an alias this torch does not have
                continue
            targets[id(obj)] = name
            _plan_object(plan, name, obj, None, None)
    for modname, module in list(sys.modules.items()):
        if not (modname == "torch" or modname.startswith("torch.")):
            continue
        try:
            attrs = dict(vars(module))
        except TypeError:
            continue
        for attr, value in attrs.items():
            name = targets.get(id(value))
            if name is None:
                name = next((n for n in names if any(p in attr for p in _patterns(n))), None)
            if name is None:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if isinstance(value, type(sys)) or not callable(value):
                    continue
            _plan_object(plan, name, value, module, attr)
    plan.kernels = _kernels_to_block(names)
    plan.loaded = frozenset(sys.modules)
    for name, funcs in plan.functions.items():
        plan.functions[name] = [(func, _guard_for(plan, func, name)) for func in funcs]
        for func in funcs:
            # The original code must not be freed in the worker (freeing touches many
            # copy-on-write pages: milliseconds). One extra reference that no Python object
            # holds (code objects are not tracked by ``gc``) keeps it, out of reach.
            _incref(ctypes.py_object(func.__code__))
    return plan


def _guard_for(plan: Plan, func, name: str):
    """The guard code to put in ``func`` (its own name, its free variables)."""
    code = func.__code__
    return _guard_code(plan, name, code.co_freevars).replace(
        co_name=code.co_name, co_qualname=getattr(code, "co_qualname", code.co_name),
        co_firstlineno=code.co_firstlineno, co_filename=code.co_filename)


def _plan_object(plan: Plan, name: str, obj, module, attr) -> None:
    funcs = plan.functions[name]
    if isinstance(obj, type):
        for key, value in list(vars(obj).items()):
            if key.startswith("__") and key not in ("__init__", "__call__", "__new__",
                                                    "__setstate__"):
                continue
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            _add_functions(funcs, value)
        return
    if _add_functions(funcs, obj):
        return
    if module is not None:
        plan.bindings[name].append((module, attr))


def _add_functions(funcs: list, obj) -> bool:
    """Add ``obj`` and what it wraps if they are Python functions; False if none is."""
    added = False
    seen = set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        if hasattr(obj, "__code__") and hasattr(obj, "__globals__"):
            if not any(f is obj for f in funcs):
                funcs.append(obj)
            added = True
        obj = getattr(obj, "__wrapped__", None) if callable(obj) else None
    return added


def _kernels_to_block(names) -> list[tuple[str, str, str]]:
    """(operator, dispatch key, forbidden name) for every ATen kernel of the APIs."""
    wanted = {}
    for name in names:
        for pattern in _patterns(name) + [name.rsplit(".", 1)[-1]]:
            wanted.setdefault(pattern, name)
    out = []
    for qual in torch._C._dispatch_get_all_op_names():
        if not qual.startswith("aten::"):
            continue
        opname = qual[len("aten::"):]
        base = opname.split(".", 1)[0]
        name = next((n for p, n in wanted.items() if p in base), None)
        if name is None:
            continue
        for key in _KERNEL_KEYS:
            try:
                if torch._C._dispatch_has_kernel_for_dispatch_key(qual, key):
                    out.append((opname, key, name))
            except Exception:  # noqa: BLE001
                continue
    return out


def _guard_code(plan: Plan, name: str, freevars: tuple[str, ...]):
    """A code object ``(*args, **kwargs) -> raise`` with the given free variables."""
    key = (name, tuple(freevars))
    if key not in plan.codes:
        cells = "".join(f"    {v} = None\n" for v in freevars)
        uses = "".join(f"        {v}\n" for v in freevars)
        src = (f"def _outer():\n{cells}    def forbidden_api(*args, **kwargs):\n{uses}"
               f"        __grader_forbidden__({name!r})\n    return forbidden_api\n")
        ns: dict = {}
        exec(compile(src, "<forbidden>", "exec"), ns)  # noqa: S102 - our own constant source
        plan.codes[key] = ns["_outer"]().__code__
    return plan.codes[key]


# --------------------------------------------------------------------------- worker side

def _swap_code(func, code) -> None:
    """Make ``func`` (a Python function) raise for every caller, however it was reached."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        func.__code__ = code


def _guard_function(name: str):
    def forbidden_api(*args, **kwargs):
        _fire(name)

    return forbidden_api


def _block_dispatcher(kernels) -> None:
    """A raising kernel for every ATen operator that implements a forbidden API."""
    if not kernels:
        return
    lib = torch._C._dispatch_library("IMPL", "aten", "")
    guards = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for opname, key, name in kernels:
            kernel = guards.setdefault(name, _guard_function(name))
            try:
                lib.impl(opname, key, kernel, False)
            except Exception:  # noqa: BLE001 - a key this op cannot take
                continue
    # The registration lives as long as ``lib``. Keep it alive with a reference that no
    # Python object holds (the handle is not tracked by ``gc`` either), so student code
    # cannot find it and reset it.
    _incref(ctypes.py_object(lib))
    del lib


class ImportGuard(importlib.abc.MetaPathFinder):
    """Imports in a guarded worker.

    - a module already loaded in the zygote may not be loaded again (``importlib.reload``,
      ``del sys.modules[...]`` then import): that would rebuild what the guards replaced;
    - a module that only exists to provide a forbidden API may not be imported;
    - a torch module loaded for the first time here is guarded as soon as it has run.
    """

    def __init__(self, plan: Plan, names, blocked: dict[str, str]):
        self.plan, self.names, self.blocked = plan, list(names), dict(blocked)
        self.busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.blocked:
            _fire(self.blocked[fullname])
        if fullname in self.plan.loaded:
            raise ImportError(f"{fullname} is already loaded and may not be loaded again "
                              "in the grader")
        if self.busy or not fullname.startswith("torch."):
            return None
        self.busy = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _GuardingLoader(spec.loader, self)
        return spec

    def guard_module(self, module) -> None:
        for attr, value in list(vars(module).items()):
            if isinstance(value, type(sys)) or not callable(value):
                continue
            for name in self.names:
                if any(p in attr for p in _patterns(name)):
                    funcs: list = []
                    if isinstance(value, type):
                        sub = Plan()
                        sub.functions[name], sub.bindings[name] = funcs, []
                        _plan_object(sub, name, value, module, attr)
                    elif not _add_functions(funcs, value):
                        setattr(module, attr, _guard_function(name))
                    for func in funcs:
                        _swap_code(func, _guard_for(self.plan, func, name))
                    break


class _GuardingLoader(importlib.abc.Loader):
    def __init__(self, loader, guard: ImportGuard):
        self.loader, self.guard = loader, guard

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.guard.guard_module(module)


def install(lab: str, names, plan: Plan) -> None:
    """Make every forbidden API of ``lab`` raise ForbiddenAPIError in this worker.

    ``plan`` is what ``index_bindings`` worked out in the zygote for all the rubric's names.
    """
    _state["lab"] = lab
    builtins.__grader_forbidden__ = _fire
    names = [n for n in names if n in plan.functions]
    if not names:
        return
    for name in names:
        for func, code in plan.functions[name]:
            _swap_code(func, code)
        guard = _guard_function(name)
        for module, attr in plan.bindings[name]:
            # A read-only attribute: the dispatcher holds.
            with contextlib.suppress(Exception):
                setattr(module, attr, guard)
    _block_dispatcher([k for k in plan.kernels if k[2] in names])
    blocked = {m: name for name in names for m in BLOCKED_MODULES.get(name, [])}
    sys.meta_path.insert(0, ImportGuard(plan, names, blocked))


# --------------------------------------------------------------------------- static scan

def static_violations(tree: ast.AST, filename: str, forbidden) -> list[str]:
    """Forbidden APIs named in a parsed module: ``F.x``, ``from torch... import x``, getattr."""
    forbidden = list(forbidden)
    if not forbidden:
        return []
    leaves = _leaves(forbidden)
    patterns = {p: name for name in forbidden for p in _patterns(name)}
    modules = {m: name for name in forbidden for m in BLOCKED_MODULES.get(name, [])}

    def match(attr: str):
        if attr in leaves:
            return leaves[attr]
        for p, name in patterns.items():
            if p in attr:
                return name
        return None

    lab_aliases = {"self"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(LAB_MODULE_PREFIX):
                    lab_aliases.add((a.asname or a.name).split(".")[0])
    found = []
    for node in ast.walk(tree):
        hit = None
        if isinstance(node, ast.Attribute) and match(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if not (isinstance(root, ast.Name) and root.id in lab_aliases):
                hit = match(node.attr)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for a in node.names:
                if match(a.name):
                    hit = match(a.name)
            if node.module in modules:
                hit = modules[node.module]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules:
                    hit = modules[a.name]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "getattr" and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            hit = match(node.args[1].value)
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            container = node.value
            if (isinstance(container, ast.Attribute) and container.attr == "__dict__") or (
                    isinstance(container, ast.Call) and isinstance(container.func, ast.Name)
                    and container.func.id == "vars"):
                hit = match(node.slice.value)
        if hit:
            found.append(f"{os.path.basename(filename)}:{node.lineno}: uses {hit}")
    return found
