"""The ``student`` proxy: how the suites reach student code without ever running it here.

Every call becomes a request to an isolated worker (``grader.sandbox``) serving one lab of
one submission; only plain values come back. A test's wall-clock budget (from the rubric)
covers all its calls: the worker is killed when it runs out, and a fresh one serves the
next test. See docs/internals.md section 3 for the API the suites use.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field

import torch

from grader.engine import relay_cost
from grader.engine.call_plan import CallPlan, PlanRecorder, Prefetcher
from grader.engine.lab_clock import LabClock
from grader.sandbox import (SandboxError, Worker, Zygote, jail,
                            protocol)
from grader.sandbox.channel import LOAD_STRETCH_MAX
from grader.engine.failures import (MAX_RECORDED_CALLS, SHOWN_EXCEPTIONS, TEXT_CAP,  # noqa: F401
                                     MissingRaise, NotMeasuredHere, RecordedCall,
                                     StudentError, StudentTimeout, _error_from_reply, _text)
from grader.engine.measuring import Measuring, _MeasuredReferences  # noqa: F401
from grader.engine.relay import (MAX_CALLBACK_ELEMENTS, MAX_CALLBACK_REPLY_BYTES,  # noqa: F401
                                 MAX_CALLBACK_SCALAR, MAX_RELAYED_BYTES_PER_SECOND, Relay)
from grader.engine.training import Training
from grader.engine.worker_link import WorkerLink


@dataclass
class Session(WorkerLink, Measuring, Training, Relay):
    """The workers for one submission (at most one live worker per lab) and the calls of
    the test being run.

    ``plan`` (grader.engine.call_plan): send each test's first call ahead of it (a
    ``Prefetcher``). ``recording``: a CallPlan to fill with each test's first request, call
    count and successor (a ``PlanRecorder``; how a plan is made).
    ``importable``: lab under test -> earlier lab -> the names it may import of it
    (``Rubric.importable``). ``reference_dir``: a folder of the course's reference
    solutions, readable by workers: calls into those names are then answered by the
    reference in a reference worker per (calling lab, other lab) (protocol "Callbacks"), so
    a lab's points depend on its own code only; None: the submission's own files answer.
    """
    zygote: Zygote
    submission_dir: str
    forbidden: dict[str, tuple[str, ...]]          # lab -> dotted names it may not use
    importable: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    reference_dir: str | None = None
    # What answers those imports when the lab is graded (the rubric's ``lab_imports``):
    # without ``reference_dir`` but "reference", a failure from an imported lab says so.
    imports_when_graded: str = "reference"
    plan: CallPlan | None = None
    recording: CallPlan | None = None
    deadline: float = float("inf")                  # monotonic time the current test ends
    # Seconds the test's deadline may still move for time its workers waited for a CPU
    # (the machine's load, never the student's): a test's later calls keep what load took
    # from its earlier ones, up to channel.LOAD_STRETCH_MAX times the test's limit.
    load_credit_s: float = 0.0
    time_limit_s: float = 10.0
    workers: dict[str, Worker] = field(default_factory=dict)
    last_stdout: str = ""
    # The current test's student calls (request and decoded reply, or the StudentError),
    # kept in this trusted process for the mistake diagnosis (grader.diagnose) of a
    # failed test; reset by start_test.
    calls: list[RecordedCall] = field(default_factory=list)
    test: str = ""                                  # node id of the current test
    lab: str = ""                                   # the lab of the current test
    made: int = 0                                   # calls the current test has made
    fault: SandboxError | None = None               # the sandbox failed us (not the student)
    # Train requests answered for this submission (lab, request frame) -> (value, Measured)
    # or the StudentError: a lab's outcome tests share one training (``train``).
    trained: dict = field(default_factory=dict)
    # The reference workers answering calls into other labs: (calling lab, other lab) ->
    # Worker; the CPU time their answers took since ``reference_cpu_ns`` was last reset (a
    # training's is the student's; ``_reference_answer``); ``measuring``: a measured call's own reference workers
    # (fresh ones, ended with it: what they use in its window is the call's, see
    # ``_MeasuredReferences``), or None.
    reference_workers: dict = field(default_factory=dict)
    reference_cpu_ns: int = 0
    last_answer_cpu_ns: int = 0     # the CPU time of the last answer (``_answer``)
    measuring: "_MeasuredReferences | None" = None
    relayed_bytes: int = 0          # tensor bytes the current test's callbacks moved
    # Tensor bytes every callback sent and read (never reset: a measured call or a
    # training takes the difference), and what moving them costs a worker of each lab
    # (``relay_cost``: calibrated once, in a fresh worker, when first needed).
    moved: relay_cost.Moved = field(default_factory=relay_cost.Moved)
    framing_rates: dict = field(default_factory=dict)
    references: dict = field(default_factory=dict)  # lab -> scratch folder of its reference
    solutions: str | None = None                    # the course's solutions/ (the references)
    # Charged with the CPU time of each lab (each test, if it asks), the workers this
    # session spawns included (``engine.lab_clock``); None: nothing is timed.
    clock: LabClock | None = None

    def __post_init__(self):
        # Every large buffer of this process (a relayed request or reply, a worker's reply)
        # gets its own mapping, returned to the kernel when freed: its peak is what it held
        # at once, not what glibc's heap kept after a burst of replies (#25).
        jail.map_large_allocations()
        self.prefetch = Prefetcher(self.plan, self._worker) if self.plan is not None else None
        self.recorder = PlanRecorder(self.recording) if self.recording is not None else None

    @property
    def ahead(self) -> list:
        """Planned calls out to a worker, in the order it answers them."""
        return self.prefetch.ahead if self.prefetch is not None else []

    def start_test(self, time_limit_s: float, test: str = "", lab: str = "",
                   plannable: bool = True) -> None:
        """A test of ``lab`` (or a lab's import probe: no test) starts now. ``plannable``:
        its first request is the same for every submission (``engine.call_plan``); a graded
        run's public tests draw inputs of each submission's own, and are never planned."""
        if lab and self.clock is not None:
            # Before the previous lab's workers end: what they spent is that lab's.
            self.clock.switch(lab, test)
        if lab and self.lab and lab != self.lab:
            # The previous lab is done: its worker, and any thread or process it started,
            # ends now rather than running on beside the next labs' tests.
            done = self.workers.pop(self.lab, None)
            if done is not None:
                done.kill()
            self._end_reference_workers()
        if lab:
            self.lab = lab
        if self.recorder is not None and test:
            self.recorder.start_test(test, plannable=plannable)
        if self.prefetch is not None:
            # Within the finished test's limit; this test's own call may be out already.
            self.prefetch.drop_unasked(test, self.time_limit_s)
        self.test, self.made = test, 0
        # Whatever the previous test's calls left running (a daemon, a fork bomb, a
        # setsid'd grandchild) ends with that test: its worker is replaced.
        for worker in [*self.workers.values(), *self.reference_workers.values()]:
            if worker.alive and worker.has_children():
                worker.kill()
        self.time_limit_s = time_limit_s
        self.relayed_bytes = 0
        self.deadline = time.monotonic() + time_limit_s
        self.load_credit_s = LOAD_STRETCH_MAX * time_limit_s
        self.calls = []
        if self.prefetch is not None:
            self.prefetch.start_test(test)

    def request(self, lab: str, req: dict):
        """Send ``req`` to the lab's worker; the reply's value. Every call is recorded."""
        try:
            value = self._send(lab, req)
        except StudentError as exc:
            self._record(RecordedCall(lab, req, error=exc))
            raise
        self._record(RecordedCall(lab, req, value=value))
        return value

    def _record(self, call: "RecordedCall") -> None:
        if len(self.calls) < MAX_RECORDED_CALLS:
            self.calls.append(call)
























    def probe(self, lab: str, *, names: list[str] = (), file: str = "") -> StudentError | None:
        """Import the lab in a worker; why it cannot be graded (import error, missing names)."""
        try:
            missing = self.request(lab, protocol.probe_request(names))
        except StudentError as exc:
            return exc
        if isinstance(missing, list) and missing:
            return StudentError(
                kind="import", lab=lab, type_name="NameError",
                message=f"{', '.join(map(str, missing))} not defined; the lab contract requires "
                        f"{', '.join(names)} (a renamed or deleted definition?)")
        return None


    def end_student_workers(self) -> None:
        """Before a measured call or a training: no worker of the student's runs beside the
        one measured. An idle one, alive, could do the call's work where nothing of the call
        is read (atk_flock_relay_generate: byte-range locks on the submission's file, shared
        by every worker, carried a recompute to the test's own worker, and both measured
        calls showed none of it). Each is started again when next asked (planned calls sent
        to one are sent again: ``Prefetcher.start_test``)."""
        for worker in self.workers.values():
            worker.kill()
        self.workers.clear()

    def close(self) -> None:
        for worker in self.workers.values():
            worker.kill()
        self.workers.clear()
        self._end_reference_workers()
        for scratch in self.references.values():
            scratch.cleanup()
        self.references.clear()


@dataclass
class Measurement:
    """What ``student.measure`` returns: the call's value and what the call used."""
    value: object
    peak_bytes: int             # peak memory of the call above its inputs (usage.charged)
    cpu_s: float                # CPU time of the worker's threads during the call
    other_processes: bool       # another process did part of the work: figures incomplete
    kept_bytes: int = 0         # held after the warm-up call (each test forgives part of it)
    inputs_bytes: int = 0       # the inputs' own bytes, taken off ``peak_bytes``


@dataclass
class GradResult:
    """What ``student.grad`` returns: the forward output and the gradients."""
    output: object
    input_grads: tuple
    param_grads: dict


def _alike(value, gen: torch.Generator, depth: int = 0):
    """``value`` with every tensor redrawn by the grader: the same shape, dtype and kind,
    other values. Floating tensors: normal around the original's mean and spread (never
    the same numbers); integer tensors (tokens): uniform over the original's range; bool
    tensors (masks: the structure of the call, not its data) and Python values as they
    are. For a warm-up call that takes the measured call's code path without any of its
    data."""
    if depth > 16:
        return value
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.numel() == 0:
            return value.clone()
        if value.is_floating_point():
            ref = value.detach().double()
            spread = float(ref.std()) if value.numel() > 1 else 0.0
            spread = spread if spread > 0 and spread == spread else 1.0
            mean = float(ref.mean())
            mean = mean if mean == mean and abs(mean) < 1e30 else 0.0
            drawn = torch.randn(value.shape, generator=gen, dtype=torch.float64)
            return (mean + spread * drawn).to(value.dtype)
        if value.is_complex():
            return torch.randn(value.shape, generator=gen, dtype=value.dtype)
        lo, hi = int(value.min()), int(value.max())
        return torch.randint(lo, hi + 1, value.shape, generator=gen, dtype=torch.int64
                             ).to(value.dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_alike(v, gen, depth + 1) for v in value)
    if isinstance(value, dict):
        return {k: _alike(v, gen, depth + 1) for k, v in value.items()}
    return value


def _tensors_of(req: dict) -> list:
    return protocol.flat_tensors([req.get("args"), list((req.get("kwargs") or {}).values()),
                                  list((req.get("state_dict") or {}).values())])


def warmup_request(req: dict, warmup: tuple | str) -> dict:
    """The warm-up of the measured request ``req`` (see ``StudentLab.measure``): "alike"
    (its own arguments redrawn) or the positional arguments ``warmup``, with its keywords
    and a module's weights redrawn (``_alike``) from a generator seeded afresh. Refuses (a
    suite's bug) a warm-up that still holds one of the measured call's tensors."""
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    if isinstance(warmup, str):
        if warmup != "alike":
            raise ValueError(f"unknown warm-up {warmup!r}")
        args = _alike(req["args"], gen)
    else:
        args = list(warmup)
    first = {**req, "args": list(args), "kwargs": _alike(req["kwargs"], gen)}
    if req.get("state_dict") is not None:
        first["state_dict"] = _alike(req["state_dict"], gen)
    measured = [t for t in _tensors_of(req) if t.dtype != torch.bool and t.numel() >= 16]
    for t in _tensors_of(first):
        if t.dtype == torch.bool or t.numel() < 16:
            continue
        if any(m.shape == t.shape and m.dtype == t.dtype and torch.equal(m, t)
               for m in measured):
            raise ValueError("a warm-up call must not be given the measured call's inputs")
    return first


def _check_args(values) -> None:
    """Fail early, in the test's own process, on a value the wire cannot carry."""
    for v in values:
        if isinstance(v, (list, tuple)):
            _check_args(v)
        elif isinstance(v, dict):
            _check_args(v.values())
        elif not (v is None or isinstance(v, (torch.Tensor, bool, int, float, str))):
            raise TypeError(f"a test passed a {type(v).__name__} to student code")


class StudentLab:
    """The ``student`` fixture: one lab of the submission under test."""

    def __init__(self, session: Session, lab: str):
        self._session, self.lab = session, lab

    def _request(self, req: dict):
        _check_args(req.get("args", ()))
        _check_args(req.get("kwargs", {}).values())
        return self._session.request(self.lab, req)

    def call(self, name: str, *args, seed: int = 0, **kwargs):
        """``<lab>.<name>(*args, **kwargs)`` in the worker."""
        return self._request(protocol.call_request(name, args, kwargs, seed))

    def measure(self, name, *args, seed: int = 0, warmup: tuple | str | None = None,
                reference: bool = False, **kwargs) -> "Measurement":
        """``<lab>.<name>(*args, **kwargs)`` in a fresh worker of its own, measured by the
        grader from the kernel's accounting: the value, the peak memory above the inputs
        (bytes), the CPU time (s) of the call (``grader.sandbox.usage``) and the memory its
        warm-up left held (``kept_bytes``). ``warmup``: a first, unmeasured call of the same
        function in the same worker, so that one-time costs are not the call's: "alike",
        on inputs of the same shapes and kinds as the measured call's with other values
        drawn by the grader (the same code path, nothing of the measured inputs); or a
        tuple, the positional arguments of that call (the same keywords, drawn alike).
        A module's warm-up runs on other weights of the same shapes (``_alike``): no
        result the warm-up computes or caches is the measured call's. The warm-up runs
        before the worker holds the measured inputs (``Session.measure``).
        ``name``: a function's name, or a module method (``ModuleHandle.measure``).
        ``reference=True``: the course's reference measured the same way, in a worker like
        the student's (the yardstick of a work test: the same machine, load and limits)."""
        req = protocol.call_request(name, args, kwargs, seed)
        _check_args(req["args"])
        _check_args(req["kwargs"].values())
        first = None
        if warmup is not None:
            first = warmup_request(req, warmup)
            _check_args(first["args"])
        value, used = self._session.measure(self.lab, req, first, reference=reference)
        return Measurement(value=value, peak_bytes=used.peak_bytes, cpu_s=used.cpu_s,
                           other_processes=used.other_processes, kept_bytes=used.kept_bytes,
                           inputs_bytes=used.inputs_bytes)

    def train(self, name: str, model_class: str, *args, seed: int = 0,
              initial_state: dict | None = None, **kwargs) -> "Measurement":
        """``<lab>.<name>(*args, **kwargs)``, which builds a ``model_class`` (starting from
        the grader's ``initial_state``) and returns it trained, run once per submission
        (every test asking the same gets the same reply): ``value`` is the protocol's train
        reply (the returned weights, the loss history), ``cpu_s`` the CPU time the call
        took (the kernel's figure)."""
        req = protocol.train_request(name, model_class, args, kwargs, seed,
                                     initial_state=initial_state)
        _check_args(req["args"])
        _check_args(req["kwargs"].values())
        value, used = self._session.train(self.lab, req)
        return Measurement(value=value, peak_bytes=used.peak_bytes, cpu_s=used.cpu_s,
                           other_processes=used.other_processes, kept_bytes=used.kept_bytes,
                           inputs_bytes=used.inputs_bytes)

    def module(self, class_name: str, *args, **kwargs) -> "ModuleHandle":
        """A handle on ``<lab>.<class_name>(*args, **kwargs)``, built afresh for every call."""
        return ModuleHandle(self, class_name, list(args), kwargs)

    def grad(self, target, *args, grad_outputs, seed: int = 0, **kwargs) -> GradResult:
        """Forward and backward in the worker; gradients of sum(output * grad_output)."""
        spec = target._spec() if isinstance(target, ModuleHandle) else target
        res = self._request(protocol.grad_request(spec, args, kwargs, grad_outputs, seed))
        if not isinstance(res, dict) or set(res) != {"output", "input_grads", "param_grads"}:
            raise StudentError(kind="crash", lab=self.lab, message="malformed gradient reply")
        return GradResult(res["output"], tuple(res["input_grads"]), dict(res["param_grads"]))

    @contextlib.contextmanager
    def raises(self, type_name: str):
        """Pass only if the student's code raised ``type_name`` (or a subclass of it)."""
        try:
            yield
        except StudentError as exc:
            if exc.kind in ("exception",) and type_name in exc.mro:
                return
            if exc.kind != "exception":
                raise
            raise MissingRaise(
                f"expected a {type_name}, but your code raised {exc.type_name}"
                + (f" at {exc.where}" if exc.where else ""),
                hidden=f"expected a {type_name}, but your code raised "
                       + (exc.type_name if exc.type_name in SHOWN_EXCEPTIONS else "another exception"),
            ) from None
        raise MissingRaise(f"expected a {type_name} to be raised, but the call returned normally")


class ModuleHandle:
    """A student ``nn.Module`` described by its constructor call, weights and mode."""

    def __init__(self, lab: StudentLab, class_name: str, args: list, kwargs: dict):
        self._lab, self.class_name = lab, class_name
        self._ctor = {"args": args, "kwargs": kwargs}
        self._state_dict = None
        self._train = False
        self._dtype = None

    def _spec(self) -> dict:
        return protocol.module_spec(self.class_name, self._ctor["args"], self._ctor["kwargs"],
                                    state_dict=self._state_dict, train=self._train,
                                    dtype=self._dtype)

    def load_state_dict(self, state_dict: dict) -> "ModuleHandle":
        self._state_dict = {k: v.detach().clone() for k, v in state_dict.items()}
        return self

    def to(self, dtype: torch.dtype) -> "ModuleHandle":
        """Build the module in float32 or float64 (module.to(dtype) before loading weights)."""
        if dtype not in (torch.float32, torch.float64):
            raise ValueError("only float32 and float64 modules are supported")
        self._dtype = str(dtype).removeprefix("torch.")
        return self

    def train(self, mode: bool = True) -> "ModuleHandle":
        self._train = bool(mode)
        return self

    def eval(self) -> "ModuleHandle":
        return self.train(False)

    def state_dict(self) -> dict:
        sd = self._lab._request(protocol.state_dict_request(self._spec()))
        if not isinstance(sd, dict):
            raise StudentError(kind="crash", lab=self._lab.lab, message="malformed state dict")
        return sd

    def buffer(self, name: str) -> torch.Tensor:
        return self._lab._request(protocol.buffer_request(self._spec(), name))

    def __call__(self, *args, seed: int = 0, **kwargs):
        return self._lab._request(protocol.call_request(self._spec(), args, kwargs, seed))

    def measure(self, name: str, *args, seed: int = 0, warmup: tuple | str | None = None,
                reference: bool = False, **kwargs) -> "Measurement":
        """``module.<name>(*args, **kwargs)`` measured as ``StudentLab.measure`` measures a
        function (the module is built in the measured call: its weights count; its warm-up
        builds one of other weights)."""
        spec = {**self._spec(), "method": name}
        return self._lab.measure(spec, *args, seed=seed, warmup=warmup,
                                 reference=reference, **kwargs)

    def method(self, name: str, *args, seed: int = 0, **kwargs):
        """``module.<name>(*args, **kwargs)`` in the worker: a public method other than
        forward (e.g. ``generate``), on the module built as for ``__call__``."""
        spec = {**self._spec(), "method": name}
        return self._lab._request(protocol.call_request(spec, args, kwargs, seed))
