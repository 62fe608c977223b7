"""What a worker pays to move a call's bytes to the relay, so that it is not charged for it.

A call into another lab (protocol "Callbacks") crosses the worker's socket: the worker's
CPU time includes the kernel copying the request's tensors out of it and the reply's into
it. That copy is the relay's, a consequence of the grader answering from another process;
an inline computation would not have it, so a measured call or a training is charged its
worker's CPU time less what its calls' bytes cost to move (DESIGN: charged to the student).

The rate is measured from outside, in a fresh worker of the same lab whose lab module is
never imported (no student code runs in it): it makes rounds of calls the cheapest way a
worker can (``protocol.calibrate_request``: one prebuilt frame sent as it is, each reply
read into one reused buffer, not decoded), answered here by an echo of a chosen size, and
the grader reads its CPU time from the kernel before and after each round. Per byte only:

- the kernel's copy is the least that any way of sending or reading bytes pays (the
  worker may not splice pages into its socket: ``jail.DENIED_ALWAYS``), so what is taken
  off never exceeds what the student paid, and moving bytes earns nothing;
- a per-call figure would not hold: requests written back to back, or refused calls
  answered at once, cost a worker less per call than any calibration of one call.

What stays charged: the stub's own work per call (checking and encoding the call, decoding
the reply) and anything the student does to the tensors before they are sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from grader.sandbox import protocol, usage, wire
from grader.sandbox.channel import Worker

# A round is a number of calls of one kind; a kind's per-call cost is the difference
# between its rounds of FEW and MANY calls (what a round does once, such as building its
# frame, cancels), and a byte's is the difference between the large and the small kinds.
# Each repeat gives a rate; the least is kept (noise on a loaded machine mostly adds), and
# only SHARE of it is taken off: a rate calibrated here came out up to 1.4x what the same
# bytes cost inside a measured call (benchmarks/bench_relay.py); what is taken off must not
# exceed what the student paid.
FEW, MANY = 2, 18
SMALL = 8               # bytes of a small request
BIG = 1 << 19           # bytes of a large request or reply
REPEATS = 5
SHARE = 0.75
TIMEOUT_S = 30.0        # the grader's own work: not the test's time


@dataclass(frozen=True)
class FramingRate:
    """CPU time (ns) a worker pays per byte of tensor it sends in a call, and per byte
    it reads in a reply."""
    request_ns_per_byte: float = 0.0
    reply_ns_per_byte: float = 0.0

    def of(self, moved: "Moved") -> int:
        """What moving ``moved`` costs at this rate (ns)."""
        return int(self.request_ns_per_byte * moved.request_bytes
                   + self.reply_ns_per_byte * moved.reply_bytes)


@dataclass
class Moved:
    """Tensor bytes a worker's calls into other labs sent and read (counted by the relay)."""
    request_bytes: int = 0
    reply_bytes: int = 0

    def since(self, earlier: "Moved") -> "Moved":
        return Moved(self.request_bytes - earlier.request_bytes,
                     self.reply_bytes - earlier.reply_bytes)

    def copy(self) -> "Moved":
        return Moved(self.request_bytes, self.reply_bytes)


def echo(reply_bytes: int):
    """A ``Worker.on_callback`` answering each calibration call with ``reply_bytes`` bytes
    (one uint8 tensor, one buffer relayed every time: nothing is copied here)."""
    payload = bytearray(reply_bytes)
    tree = {"__tensor__": 0, "dtype": "uint8", "shape": [reply_bytes]}

    def answer(req, _raw):
        if not (isinstance(req, dict) and req.get("lab") == protocol.CALIBRATION_LAB):
            raise ValueError("only calibration calls are answered here")
        return wire.Raw(tree, payload, 1)

    return answer


def calibrate(worker: Worker) -> FramingRate:
    """The framing rate of ``worker``, a fresh worker whose lab is not imported (the caller
    kills it after). Raises ``RuntimeError`` if it does not answer as the grader's code
    does (a sandbox fault, not the student's)."""
    kinds = {"small": (SMALL, echo(0)), "request": (BIG, echo(0)),
             "reply": (SMALL, echo(BIG))}
    rates = []
    for _ in range(REPEATS):
        per_call = {}
        for kind, (request_bytes, answer) in kinds.items():
            worker.on_callback = answer
            spent = {}
            for calls in (FEW, MANY):
                before = usage.reading(worker.pid).cpu_ns
                reply = worker.request(protocol.calibrate_request(calls, request_bytes),
                                       timeout_s=TIMEOUT_S)
                spent[calls] = usage.reading(worker.pid).cpu_ns - before
                if not (isinstance(reply, dict) and "ok" in reply):
                    raise RuntimeError(f"the relay's calibration failed: {str(reply)[:300]}")
            per_call[kind] = (spent[MANY] - spent[FEW]) / (MANY - FEW)
        rates.append(FramingRate(max(0.0, per_call["request"] - per_call["small"]) / BIG,
                                 max(0.0, per_call["reply"] - per_call["small"]) / BIG))
    return FramingRate(SHARE * min(r.request_ns_per_byte for r in rates),
                       SHARE * min(r.reply_ns_per_byte for r in rates))
