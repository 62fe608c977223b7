"""The wire format between the trusted grader and an untrusted worker.

A frame is a 4-byte big-endian header length, a UTF-8 JSON header, then the raw bytes of
every tensor the header mentions, back to back. A tensor is written in JSON as
``{"__tensor__": index, "dtype": "float32", "shape": [2, 3]}`` and its bytes are buffer
``index``. Nothing is pickled: decoding builds only dicts, lists, strings, numbers, booleans,
None and plain ``torch.Tensor`` objects, after checking dtype, shape and sizes against caps.

This module is loaded by path inside the worker too, so it imports only the stdlib and torch.
"""

from __future__ import annotations

import json
import math
import socket
import struct
import time

import torch

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

MAX_HEADER_BYTES = 1 << 20        # 1 MiB of JSON
MAX_FRAME_BYTES = 256 << 20       # 256 MiB of tensor data in one frame
MAX_TENSORS = 4096
MAX_DEPTH = 16
MAX_NDIM = 8


class WireError(Exception):
    """A frame that breaks the format: bad JSON, unknown dtype, wrong sizes, too big."""


class PeerClosed(WireError):
    """The other end closed the channel (for a worker: it died)."""


def encode(obj) -> bytes:
    """One frame for ``obj`` (tensors, scalars, str, None, lists/tuples/dicts of these)."""
    buffers: list[bytes] = []

    def enc(x, depth=0):
        if depth > MAX_DEPTH:
            raise WireError("value nested too deeply")
        if isinstance(x, torch.Tensor):
            t = x.detach()
            if t.layout != torch.strided:
                t = t.to_dense()
            t = t.cpu().contiguous()
            name = DTYPE_NAMES.get(t.dtype)
            if name is None:
                raise WireError(f"tensor dtype {t.dtype} cannot cross the wire")
            # bfloat16 has no numpy dtype: ship its bytes through a same-size integer view.
            raw = t.view(torch.int16) if t.dtype in (torch.bfloat16, torch.float16) else t
            buffers.append(raw.numpy().tobytes() if t.numel() else b"")
            return {"__tensor__": len(buffers) - 1, "dtype": name, "shape": list(t.shape)}
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return int(x)
        if isinstance(x, float):
            if math.isfinite(x):
                return float(x)
            return {"__float__": repr(float(x))}
        if isinstance(x, tuple):
            return {"__tuple__": [enc(v, depth + 1) for v in x]}
        if isinstance(x, list):
            return [enc(v, depth + 1) for v in x]
        if isinstance(x, dict):
            if not all(isinstance(k, str) for k in x):
                raise WireError("dict keys must be strings")
            if any(k.startswith("__") and k.endswith("__") for k in x):
                return {"__dict__": [[k, enc(v, depth + 1)] for k, v in x.items()]}
            return {k: enc(v, depth + 1) for k, v in x.items()}
        raise WireError(f"a value of type {type(x).__name__} cannot cross the wire")

    header = json.dumps(enc(obj), separators=(",", ":")).encode()
    if len(header) > MAX_HEADER_BYTES:
        raise WireError("header too large")
    return struct.pack(">II", len(header), len(buffers)) + header + b"".join(
        struct.pack(">Q", len(b)) + b for b in buffers
    )


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    chunks = []
    while n:
        if deadline is not None:
            # A peer that trickles a frame out byte by byte is held to the same deadline.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("deadline passed while reading a frame")
            sock.settimeout(remaining)
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise PeerClosed("channel closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket, *, max_bytes: int = MAX_FRAME_BYTES,
               deadline: float | None = None):
    """Read one frame and decode it (see ``decode``); raises PeerClosed or WireError.

    With ``deadline`` (a ``time.monotonic()`` value) the whole frame must arrive by then,
    else ``socket.timeout`` is raised.
    """
    header_len, n_buffers = struct.unpack(">II", _recv_exact(sock, 8, deadline))
    if header_len > MAX_HEADER_BYTES or n_buffers > MAX_TENSORS:
        raise WireError("frame header exceeds the caps")
    header = _recv_exact(sock, header_len, deadline)
    buffers, total = [], 0
    for _ in range(n_buffers):
        (size,) = struct.unpack(">Q", _recv_exact(sock, 8, deadline))
        total += size
        if total > max_bytes:
            raise WireError(f"frame carries more than {max_bytes} bytes of tensors")
        buffers.append(_recv_exact(sock, size, deadline))
    return decode(header, buffers)


def send_frame(sock: socket.socket, obj) -> None:
    sock.sendall(encode(obj))


def decode(header: bytes, buffers: list[bytes]):
    """Rebuild a value from a header and its buffers, checking every tensor's metadata."""
    try:
        tree = json.loads(header.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"malformed header: {str(exc)[:200]}") from None
    used: set[int] = set()

    def dec(x, depth=0):
        if depth > MAX_DEPTH:
            raise WireError("value nested too deeply")
        if x is None or isinstance(x, (bool, str, int)):
            return x
        if isinstance(x, float):
            if not math.isfinite(x):  # e.g. 1e999 in the JSON text
                raise WireError("non-finite number outside a __float__ marker")
            return x
        if isinstance(x, list):
            return [dec(v, depth + 1) for v in x]
        if not isinstance(x, dict):
            raise WireError("unexpected JSON value")
        if "__tensor__" in x:
            return _tensor(x, buffers, used)
        if "__tuple__" in x:
            items = x["__tuple__"]
            if not isinstance(items, list):
                raise WireError("malformed tuple")
            return tuple(dec(v, depth + 1) for v in items)
        if "__float__" in x:
            text = x["__float__"]
            if text not in ("inf", "-inf", "nan"):
                raise WireError("malformed float")
            return float(text)
        if "__dict__" in x:
            items = x["__dict__"]
            if not isinstance(items, list) or not all(
                    isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], str)
                    for kv in items):
                raise WireError("malformed dict")
            return {k: dec(v, depth + 1) for k, v in items}
        return {str(k): dec(v, depth + 1) for k, v in x.items()}

    try:
        value = dec(tree)
    except WireError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, RecursionError, OverflowError,
            MemoryError) as exc:
        # A frame from an untrusted peer may be any JSON at all: never let it raise
        # anything but WireError in the trusted process.
        raise WireError(f"malformed frame: {type(exc).__name__}") from None
    if len(used) != len(buffers):
        raise WireError("frame carries buffers that no tensor uses")
    return value


def _no_constant(name):
    raise ValueError(f"JSON constant {name} is not allowed")


def _tensor(meta: dict, buffers: list[bytes], used: set[int]) -> torch.Tensor:
    index, dtype_name, shape = meta.get("__tensor__"), meta.get("dtype"), meta.get("shape")
    if set(meta) != {"__tensor__", "dtype", "shape"}:
        raise WireError("malformed tensor metadata")
    if not isinstance(index, int) or not 0 <= index < len(buffers) or index in used:
        raise WireError("tensor refers to a missing or reused buffer")
    if dtype_name not in DTYPES:
        raise WireError(f"dtype {dtype_name!r} is not allowed")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_NDIM
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d for d in shape)
    ):
        raise WireError("malformed tensor shape")
    used.add(index)
    dtype = DTYPES[dtype_name]
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    data = buffers[index]
    if len(data) != numel * itemsize:
        raise WireError(
            f"tensor of shape {tuple(shape)} and dtype {dtype_name} needs {numel * itemsize} "
            f"bytes, the frame gave {len(data)}"
        )
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    raw_dtype = torch.int16 if dtype in (torch.bfloat16, torch.float16) else dtype
    flat = torch.frombuffer(bytearray(data), dtype=raw_dtype)
    return flat.view(dtype).reshape(shape).clone()
