"""The worker protocol (grader/sandbox/protocol.py): its requests, and one way to answer them.

The builders must give the very dicts the grader has always sent (call plans compare
encoded frames byte for byte). Every op is answered twice here, with the same lab code: by
a real sandbox worker, and by ``grader.mistakes.replay`` in this process; the answers must
be identical, since a mistake is only recognised when it answers as the worker would.
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from grader.mistakes import ReplayError, replay
from grader.sandbox import make_scratch, wire
from grader.sandbox.protocol import (buffer_request, call_request, grad_request, module_spec,
                                     probe_request, state_dict_request)

LAB = "lab8_protocol"
SOURCE = '''
import torch
from torch import nn


def attend(q, k, *, scale=1.0):
    """(B, T, d), (B, S, d) -> (B, T, d) output, (B, T, S) weights."""
    w = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
    return w @ k, w


def first_only(x, y, n):
    return x * n


def detached(x):
    return x.detach() * 2.0


def noisy(x):
    return nn.functional.dropout(x, 0.5, training=True)


def double_in_place(x):
    x.mul_(2.0)
    return x


def broken(x):
    raise ValueError("broken on purpose")


class Block(nn.Module):
    def __init__(self, d, dropout=0.0):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.drop = nn.Dropout(dropout)
        self.register_buffer("scale", torch.arange(1.0, d + 1.0))

    def forward(self, x, mask=None):
        y = self.drop(self.proj(self.norm(x))) * self.scale
        return y if mask is None else y.masked_fill(~mask, 0.0)


class NotAModule:
    def __init__(self, d):
        self.d = d
'''


# ------------------------------------------------------------------------------ builders

def _tensors():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 4, generator=gen), torch.randn(2, 5, 4, generator=gen)
    sd = {"w": torch.randn(4, 4, generator=gen, dtype=torch.float64)}
    return q, k, sd


def _same_frame(got: dict, expected: dict) -> None:
    assert wire.encode(got) == wire.encode(expected)    # values, types and key order


def test_probe_request():
    _same_frame(probe_request(("attend", "Block")),
                {"op": "probe", "names": ["attend", "Block"]})


def test_call_request_of_a_function():
    q, k, _ = _tensors()
    _same_frame(call_request("attend", (q, k), {"scale": 0.5}, seed=3),
                {"op": "call", "target": "attend", "args": [q, k], "kwargs": {"scale": 0.5},
                 "seed": 3})
    _same_frame(call_request("identity", [["/a", "/b"]], {}),
                {"op": "call", "target": "identity", "args": [["/a", "/b"]], "kwargs": {},
                 "seed": 0})


def test_module_spec():
    _, _, sd = _tensors()
    _same_frame(module_spec("Block", (4,), {"dropout": 0.1}, state_dict=sd, train=True,
                            dtype="float64"),
                {"target": "Block", "ctor": {"args": [4], "kwargs": {"dropout": 0.1}},
                 "state_dict": sd, "train": True, "dtype": "float64"})
    _same_frame(module_spec("Block", [4], {}),
                {"target": "Block", "ctor": {"args": [4], "kwargs": {}},
                 "state_dict": None, "train": False, "dtype": None})


def test_call_request_of_a_module():
    q, k, sd = _tensors()
    spec = module_spec("Block", [4], {"dropout": 0.1}, state_dict=sd, train=True,
                       dtype="float64")
    _same_frame(call_request(spec, (q,), {"mask": k}, seed=5),
                {"target": "Block", "ctor": {"args": [4], "kwargs": {"dropout": 0.1}},
                 "state_dict": sd, "train": True, "dtype": "float64",
                 "op": "call", "args": [q], "kwargs": {"mask": k}, "seed": 5})


def test_grad_request_of_a_function():
    q, k, _ = _tensors()
    _same_frame(grad_request("attend", (q, k), {"scale": 2.0}, [q, None]),
                {"op": "grad", "args": [q, k], "kwargs": {"scale": 2.0}, "seed": 0,
                 "grad_outputs": [q, None], "target": "attend"})
    # A bare tensor is the one output's gradient, not a list of its rows.
    _same_frame(grad_request("first_only", [q], {}, k, seed=7),
                {"op": "grad", "args": [q], "kwargs": {}, "seed": 7, "grad_outputs": [k],
                 "target": "first_only"})


def test_grad_request_of_a_module():
    q, _, sd = _tensors()
    spec = module_spec("Block", [4], {}, state_dict=sd, dtype="float32")
    _same_frame(grad_request(spec, [q], {}, (q,), seed=2),
                {"op": "grad", "args": [q], "kwargs": {}, "seed": 2, "grad_outputs": [q],
                 "target": "Block", "ctor": {"args": [4], "kwargs": {}}, "state_dict": sd,
                 "train": False, "dtype": "float32"})


def test_state_dict_and_buffer_requests():
    spec = module_spec("Block", [4], {"dropout": 0.1}, train=True)
    head = {"target": "Block", "ctor": {"args": [4], "kwargs": {"dropout": 0.1}},
            "state_dict": None, "train": True, "dtype": None}
    _same_frame(state_dict_request(spec),
                {**head, "op": "state_dict", "args": [], "kwargs": {}, "seed": 0})
    _same_frame(buffer_request(spec, "scale"),
                {**head, "op": "buffer", "name": "scale", "args": [], "kwargs": {}, "seed": 0})


# ------------------------------------------------------------------------------ both sides

class SameCode:
    """An ``Impl`` for ``replay`` that resolves names in the code the worker runs."""

    lab = LAB

    def __init__(self):
        self.module = types.ModuleType(LAB)
        exec(compile(SOURCE, f"{LAB}.py", "exec"), self.module.__dict__)

    def resolve(self, name: str):
        return getattr(self.module, name, None)

    def key(self) -> tuple:
        return (LAB, id(self))


@pytest.fixture(scope="module")
def worker(zygote):
    scratch = make_scratch({f"{LAB}.py": SOURCE.encode()})
    w = zygote.spawn(submission=scratch.name, lab=LAB, forbidden=[])
    yield w
    w.kill()
    scratch.cleanup()


@contextlib.contextmanager
def _one_thread():
    """As in the zygote (and in diagnose): one intra-op thread, so sums add up alike."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _answers(worker, req: dict):
    """The worker's reply and the trusted replay's Result for ``req``."""
    reply = worker.request(req, timeout_s=60)
    with _one_thread():
        result = replay(SameCode(), req)
    return reply, result


def _identical(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (type(a) is torch.Tensor and type(b) is torch.Tensor and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_identical(x, y) for x, y in zip(a, b, strict=False))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_identical(a[k], b[k]) for k in a)
    return a == b


def _requests() -> dict:
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 3, 4, generator=gen), torch.randn(2, 5, 4, generator=gen)
    w = torch.randn(2, 3, 5, generator=gen)
    x64 = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64)
    mask = torch.rand(2, 3, 4, generator=gen) > 0.3
    sd = {name: torch.randn(t.shape, generator=gen, dtype=torch.float64)
          for name, t in (("proj.weight", torch.empty(4, 4)), ("proj.bias", torch.empty(4)),
                          ("norm.weight", torch.empty(4)), ("norm.bias", torch.empty(4)),
                          ("scale", torch.empty(4)))}
    trained = module_spec("Block", [4], {"dropout": 0.5}, state_dict=sd, train=True,
                          dtype="float64")
    return {
        "call a function": call_request("attend", [q, k], {"scale": 0.5}, seed=3),
        "call a function that draws random numbers": call_request("noisy", [q], {}, seed=11),
        "call a module (ctor, dtype, state dict, train)": call_request(
            trained, [x64], {"mask": mask}, seed=5),
        "call a module as built (seeded init, eval)": call_request(
            module_spec("Block", [4], {}), [q], {}),
        "grad of a function": grad_request("attend", [q, k], {}, [q, w]),
        "grad of a function, unused and non-tensor inputs": grad_request(
            "first_only", [q, k, 3], {}, q),
        "grad of a module": grad_request(trained, [x64], {}, [x64 * 2.0], seed=2),
        "grad of a module as built": grad_request(module_spec("Block", [4], {}), [q], {}, q),
        "state_dict": state_dict_request(module_spec("Block", [4], {}, dtype="float64")),
        "buffer": buffer_request(module_spec("Block", [4], {}, state_dict={
            n: v.float() for n, v in sd.items()}), "scale"),
    }


@pytest.mark.parametrize("what", list(_requests()))
def test_the_worker_and_the_replay_answer_alike(worker, what):
    reply, result = _answers(worker, _requests()[what])
    assert "ok" in reply, reply
    assert result.ok, result.error
    assert _identical(reply["ok"], result.value)


def _failing_requests() -> dict:
    x = torch.ones(2, 3)
    return {
        "no such target": (call_request("nowhere", [x], {}), "AttributeError"),
        "the student's exception": (call_request("broken", [x], {}), "ValueError"),
        "a class that builds no module": (
            call_request(module_spec("NotAModule", [3], {}), [x], {}), "TypeError"),
        "no such buffer": (buffer_request(module_spec("Block", [3], {}), "nope"),
                           "AttributeError"),
        "an output cut off from the inputs": (grad_request("detached", [x], {}, x),
                                              "GradientError"),
        "no output to differentiate": (grad_request("attend", [x, x], {}, [None, None]),
                                       "GradientError"),
    }


@pytest.mark.parametrize("what", list(_failing_requests()))
def test_the_worker_and_the_replay_raise_alike(worker, what):
    req, type_name = _failing_requests()[what]
    reply, result = _answers(worker, req)
    assert reply["error"]["type"] == type_name, reply
    assert type(result.error).__name__ == type_name, result


def test_a_replay_works_on_copies_of_the_request(worker):
    x = torch.ones(2, 3)
    req = call_request("double_in_place", [x], {})
    reply, first = _answers(worker, req)
    second = replay(SameCode(), req)
    assert torch.equal(x, torch.ones(2, 3))
    assert _identical(reply["ok"], first.value) and _identical(first.value, second.value)


def test_an_unknown_op_is_refused_on_both_sides(worker):
    req = {"op": "launch", "target": "attend", "args": [], "kwargs": {}, "seed": 0}
    reply = worker.request(req, timeout_s=60)
    assert reply["error"]["type"] == "ValueError" and "unknown op" in reply["error"]["message"]
    with pytest.raises(ReplayError):
        replay(SameCode(), req)


def test_plain_takes_numpy_scalars_as_numbers_and_names_what_it_refuses():
    """A numpy scalar crosses as the Python number it holds (a student's own lab 1 takes
    np.int64(4) as 4); anything else is refused naming where it was (a call into another
    lab says which call), never "returned" for an argument."""
    import numpy as np

    from grader.sandbox.protocol import plain

    value = plain({"n": np.int64(4), "p": np.float32(0.5), "on": np.bool_(True)})
    assert value == {"n": 4, "p": 0.5, "on": True}
    assert [type(v) for v in value.values()] == [int, float, bool]
    with pytest.raises(TypeError, match=r"^lab1_attention.causal_mask was given a set, "):
        plain([1, {2}], what="lab1_attention.causal_mask was given")
    with pytest.raises(TypeError, match=r"^returned a ndarray, "):
        plain(np.zeros(3))
