"""The wire format between the trusted grader and an untrusted worker.

A frame is a 4-byte big-endian header length and an 8-byte payload length, a UTF-8 JSON
header, then the payload: the raw bytes of every tensor the header mentions, in index
order, each padded with zeros to a multiple of 8 bytes. A tensor is written in JSON as
``{"__tensor__": index, "dtype": "float32", "shape": [2, 3]}``; its size follows from its
dtype and shape, so a frame is read with three exact reads, whatever it carries, and every
tensor is a view of the (8-byte aligned) payload buffer: nothing is copied twice. Nothing
is pickled: decoding builds only dicts, lists, strings, numbers, booleans, None and plain
``torch.Tensor`` objects, after checking dtype, shape and sizes against caps.

This module is loaded by path inside the worker too, so it imports only the stdlib and torch.
"""

from __future__ import annotations

import json
import math
import socket
import struct
import time
from dataclasses import dataclass

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
ITEMSIZE = {name: torch.empty((), dtype=dtype).element_size() for name, dtype in DTYPES.items()}
PREFIX = struct.Struct(">IQ")     # header length, payload length
ALIGN = 8                         # every tensor's bytes start at a multiple of this
_TENSOR_KEYS = frozenset(("__tensor__", "dtype", "shape"))
_PADDING = bytes(ALIGN)

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
    chunks = encode_parts(obj)
    try:
        return b"".join(chunks)
    finally:
        chunks.clear()


def encode_parts(obj) -> list:
    """``encode(obj)`` as chunks to send one after the other: the prefix and header, then
    each tensor's bytes as a view of its memory (a contiguous tensor is not copied; keep
    it unchanged until the chunks are sent) and its padding."""
    buffers: list = []
    count = [0]

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
            data = memoryview(raw.reshape(-1).numpy()).cast("B") if t.numel() else b""
            buffers.append(data)
            if len(data) % ALIGN:
                buffers.append(_PADDING[:-len(data) % ALIGN])
            count[0] += 1
            return {"__tensor__": count[0] - 1, "dtype": name, "shape": list(t.shape)}
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

    try:
        header = json.dumps(enc(obj), separators=(",", ":")).encode()
        if len(header) > MAX_HEADER_BYTES:
            raise WireError("header too large")
        size = sum(len(b) for b in buffers)
        return [PREFIX.pack(len(header), size) + header, *buffers]
    finally:
        # ``enc`` refers to itself, so it and what it holds wait for the cyclic garbage
        # collector: the tensors' bytes must not (a few big frames would pile up).
        enc = None  # noqa: F841


# Whole reads where the platform has the flag; the loops around each read finish the rest.
_WAITALL = getattr(socket, "MSG_WAITALL", 0)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytearray:
    """Exactly ``n`` bytes. A blocking socket without a deadline reads them in one call."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        if deadline is not None:
            # A peer that trickles a frame out byte by byte is held to the same deadline.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("deadline passed while reading a frame")
            sock.settimeout(remaining)
            size = sock.recv_into(view[got:], n - got)
        else:
            size = sock.recv_into(view[got:], n - got, _WAITALL)
        if not size:
            raise PeerClosed("channel closed")
        got += size
    return buf


def recv_frame(sock: socket.socket, *, max_bytes: int = MAX_FRAME_BYTES,
               deadline: float | None = None):
    """Read one frame and decode it (see ``decode``); raises PeerClosed or WireError.

    With ``deadline`` (a ``time.monotonic()`` value) the whole frame must arrive by then,
    else ``socket.timeout`` is raised.
    """
    header_len, payload_len = PREFIX.unpack(_recv_exact(sock, PREFIX.size, deadline))
    if header_len > MAX_HEADER_BYTES:
        raise WireError("frame header exceeds the caps")
    if payload_len > max_bytes:
        raise WireError(f"frame carries more than {max_bytes} bytes of tensors")
    header = bytes(_recv_exact(sock, header_len, deadline))
    return decode(header, _recv_exact(sock, payload_len, deadline))


def recv_frame_into(sock: socket.socket, buffer: bytearray) -> bytearray:
    """Read one frame's header and payload into ``buffer`` (a new one when it is too
    small), undecoded: the least any reader of a frame does (``relay_cost`` calibrates
    with it). Its bytes are ``buffer[:header_len + payload_len]``."""
    header_len, payload_len = PREFIX.unpack(_recv_exact(sock, PREFIX.size))
    size = header_len + payload_len
    if header_len > MAX_HEADER_BYTES or payload_len > MAX_FRAME_BYTES:
        raise WireError("frame exceeds the caps")
    if len(buffer) < size:
        buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        got_now = sock.recv_into(view[got:size], size - got, _WAITALL)
        if not got_now:
            raise PeerClosed("channel closed")
        got += got_now
    return buffer


def decode_frame(frame: bytes) -> object:
    """Decode one whole frame held in memory (``recv_frame`` reads one from a socket)."""
    if len(frame) < PREFIX.size:
        raise WireError("frame shorter than its prefix")
    header_len, payload_len = PREFIX.unpack_from(frame)
    start = PREFIX.size + header_len
    if len(frame) != start + payload_len:
        raise WireError("frame length does not match its prefix")
    return decode(bytes(frame[PREFIX.size:start]), bytearray(frame[start:]))


def send_frame(sock: socket.socket, obj) -> None:
    sock.sendall(encode(obj))


MAX_IOV = 512                     # buffers per sendmsg (the kernel's IOV_MAX is 1024)


def send_parts(sock: socket.socket, chunks: list) -> None:
    """Send ``chunks`` (``encode_parts``) in order on a blocking socket, as few system calls
    as the socket takes: one ``sendmsg`` of them all where it can (a call into another lab
    costs its worker one write, not one per tensor)."""
    views = [memoryview(c).cast("B") for c in chunks if len(c)]
    if not hasattr(sock, "sendmsg"):        # Windows: one write a chunk
        for view in views:
            sock.sendall(view)
        return
    start = 0
    while start < len(views):
        sent = sock.sendmsg(views[start:start + MAX_IOV])
        while start < len(views) and sent >= len(views[start]):
            sent -= len(views[start])
            start += 1
        if sent:
            views[start] = views[start][sent:]


def decode(header: bytes, payload: bytearray) -> object:
    """Rebuild a value from a header and its payload, checking every tensor's metadata.

    Tensors must take the payload in index order (0, 1, 2, ...), each its own dtype and
    shape's worth of bytes (padded to ``ALIGN``), and together all of it. The tensors are
    views of ``payload``, which must be a buffer of its own (as ``recv_frame`` reads it).
    """
    return decode_raw(header, payload)[0]


@dataclass
class Raw:
    """A frame kept as it came, after ``decode_raw`` checked it: its parsed JSON header
    (``tree``), its payload bytes and how many tensors take them. A part of it that holds
    every one of its tensors (``part``) can be sent on in another frame with the same
    payload (``parts``): relayed without a tensor ever being copied or rebuilt here."""
    tree: object
    payload: bytearray
    tensors: int

    def part(self, key: str) -> "Raw | None":
        """The value under ``key`` of the frame's top-level dict, if it holds all of the
        frame's tensors (in their order: the frame's is the only one); else None."""
        if not isinstance(self.tree, dict) or key not in self.tree:
            return None
        sub = self.tree[key]
        return Raw(sub, self.payload, self.tensors) if _count_tensors(sub) == self.tensors \
            else None


def _count_tensors(tree, depth: int = 0) -> int:
    """Tensor markers in a header tree that ``decode`` accepted (its depth is bounded)."""
    if depth > 4 * MAX_DEPTH:
        return -1
    if isinstance(tree, list):
        return sum(_count_tensors(v, depth + 1) for v in tree)
    if isinstance(tree, dict):
        if "__tensor__" in tree:
            return 1
        return sum(_count_tensors(v, depth + 1) for v in tree.values())
    return 0


def parts(tree, payload) -> list:
    """A frame whose header is ``tree`` (a header tree, as ``Raw.tree``: its tensor markers
    index ``payload``) and whose payload is ``payload``, as chunks to send one after the
    other: the payload is not copied."""
    header = json.dumps(tree, separators=(",", ":")).encode()
    if len(header) > MAX_HEADER_BYTES:
        raise WireError("header too large")
    return [PREFIX.pack(len(header), len(payload)) + header, memoryview(payload)]


def decode_raw(header: bytes, payload: bytearray) -> tuple[object, Raw]:
    """``decode``, and the frame as a ``Raw`` (to relay a part of it unchanged)."""
    try:
        tree = json.loads(header.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"malformed header: {str(exc)[:200]}") from None
    cursor = _Cursor(payload)

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
            return _tensor(x, cursor)
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
    except Exception as exc:  # noqa: BLE001 - e.g. torch's RuntimeError for a shape whose
        # strides overflow: a frame from an untrusted peer may be any JSON at all, and
        # must never raise anything but WireError in the trusted process.
        raise WireError(f"malformed frame: {type(exc).__name__}") from None
    finally:
        # ``dec`` refers to itself (a reference cycle through its closure, which holds the
        # cursor and so the payload): broken here, so the payload is freed as soon as its
        # tensors are, not at the next cyclic collection (a measured worker's warm-up
        # inputs stayed held through the measured call, #26).
        dec = None  # noqa: F841
        cursor.payload = cursor._bytes = None
    if cursor.offset != len(payload):
        raise WireError("frame carries bytes that no tensor uses")
    return value, Raw(tree, payload, cursor.index)


def _no_constant(name):
    raise ValueError(f"JSON constant {name} is not allowed")


class _Cursor:
    """Where the next tensor's bytes start in a frame's payload."""

    def __init__(self, payload: bytearray):
        self.payload, self.offset, self.index = payload, 0, 0
        self._bytes = None

    def take(self, start: int, size: int) -> torch.Tensor:
        """``size`` bytes of the payload from ``start``, as a uint8 tensor (no copy)."""
        if self._bytes is None:
            # One tensor over the whole payload; every tensor of the frame is a view of it.
            self._bytes = torch.frombuffer(self.payload, dtype=torch.uint8)
        return self._bytes[start:start + size]


def _tensor(meta: dict, cursor: _Cursor) -> torch.Tensor:
    index, dtype_name, shape = meta.get("__tensor__"), meta.get("dtype"), meta.get("shape")
    if meta.keys() != _TENSOR_KEYS:
        raise WireError("malformed tensor metadata")
    if not isinstance(index, int) or isinstance(index, bool) or index != cursor.index:
        raise WireError("tensors must use the payload in order, each once")
    if dtype_name not in DTYPES:
        raise WireError(f"dtype {dtype_name!r} is not allowed")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_NDIM
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise WireError("malformed tensor shape")
    dtype = DTYPES[dtype_name]
    numel = math.prod(shape)
    size = numel * ITEMSIZE[dtype_name]
    start = cursor.offset
    padded = -(-size // ALIGN) * ALIGN
    if start + padded > len(cursor.payload):
        raise WireError(
            f"tensor of shape {tuple(shape)} and dtype {dtype_name} needs {padded} bytes, "
            f"the frame has {len(cursor.payload) - start} left"
        )
    cursor.offset, cursor.index = start + padded, index + 1
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    # ``start`` is a multiple of ALIGN in an aligned buffer: a view in any dtype is valid.
    return cursor.take(start, size).view(dtype).view(shape)
