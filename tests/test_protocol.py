"""The worker protocol (grader/sandbox/protocol.py): its requests.

The builders must give the very dicts the grader has always sent (call plans compare
encoded frames byte for byte).
"""

from __future__ import annotations

import torch

from grader.sandbox import wire
from grader.sandbox.protocol import (buffer_request, call_request, grad_request, module_spec,
                                     probe_request, state_dict_request)

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
