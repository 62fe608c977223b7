"""The suites' own cost: grade the reference solutions with and without the sandbox.

    .venv/bin/python benchmarks/in_process_floor.py [--repeat 20] [--json out.json]

Grades ``solutions/`` ``--repeat`` times in one warm process with one ``Grader`` (as
a batch's grading process does), two ways, in alternation:

- sandboxed: through the zygote and a fresh locked-down worker per lab, exactly as
  ``grader batch`` grades every student;
- in-process: the same pytest session, the same tests, the same requests encoded and
  decoded on the same wire, but answered in this process by the worker's own request
  handler on the reference modules, imported once. No fork, no jail, no fresh import, no
  cold process: what grading these suites costs with no isolation at all.

The in-process figure is a floor for any grader that runs these suites: no sandbox design
can make a submission cheaper than the tests' and the reference code's own work. It runs
only the instructor's solutions (trusted code), never a submission, and lives here, not in
``grader``, so that the grader has no way to run a lab module in its own process.

Prints one JSON object: CPU seconds per submission for each way, the part spent in the
lab code itself, the scores, and whether both ways gave the same report; and the same per
lab (``by_lab``: each lab's import probe, tests and workers, timed by
``grader.engine.lab_clock`` as a batch times them; ``outside_labs_cpu_s``: sanitizing and
scoring; they add up to the total), the costliest tests of each lab (``top_tests``), and
lab 8's training as its worker's kernel accounting reports it to the student
(``training_cpu_s``; sandboxed only: in-process the training runs in this process). A
shared VM's speed drifts (by up to 1.5x over minutes here): the two ways are measured in
alternation, so their ratio holds even when the absolute figures move.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import re
import sys
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from grader import paths  # noqa: E402
from grader.course import Course  # noqa: E402
from grader.engine import relay_cost  # noqa: E402
from grader.engine.lab_clock import OUTSIDE, LabClock  # noqa: E402
from grader.grading import Grader  # noqa: E402
from grader.engine.reference import load_reference, use_solutions  # noqa: E402
from grader.rubric import load_rubric  # noqa: E402
from grader.sandbox import Zygote, wire  # noqa: E402


@functools.cache
def _worker_module():
    """grader/sandbox/worker.py, imported as the zygote imports it (by its folder)."""
    folder = str(Path(paths.__file__).parent / "sandbox")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module("worker")
    finally:
        sys.path.remove(folder)


@functools.cache
def _reference_server():
    """The worker's request handler, with the reference module as the lab module."""
    class ReferenceServer(_worker_module().Server):
        def lab_module(self):
            use_solutions(paths.KIT / "solutions")      # the kit's references, as a Grader's
            return load_reference(self.lab)

    return ReferenceServer


_IDLE: subprocess.Popen | None = None


def _idle_pid() -> int:
    """A process that does nothing until this one ends (it reads its stdin to EOF)."""
    global _IDLE
    if _IDLE is None or _IDLE.poll() is not None:
        _IDLE = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                 stdin=subprocess.PIPE)
    return _IDLE.pid


class InProcessWorker:
    """A ``host.Worker`` stand-in that answers in this process, on the reference modules.

    Requests and replies still cross ``wire`` (encoded and decoded), so the trusted side
    does the same work as with a real worker.
    """

    def __init__(self, lab: str, zygote: "InProcessZygote | None" = None):
        self.server = _reference_server()(None, {"lab": lab, "folder": str((paths.KIT / "solutions"))})
        self.zygote = zygote
        # A resource test's measurement (grader/sandbox/usage.py) reads an idle process:
        # the floor answers those calls but measures nothing of them (a reading of this
        # busy process would make the tests' outcomes depend on the benchmark's own work).
        self.alive, self.pid = True, _idle_pid()
        self.load_delay_s = 0.0       # no wait for a CPU to credit: it runs in this process
        self.on_callback = None
        self.queue: list[bytes] = []
        self.handler_s = 0.0            # thread CPU seconds spent in the lab code's handler

    def send_ahead(self, frames: bytes, *, count: int) -> None:
        data = bytes(frames)
        for _ in range(count):
            header_len, payload_len = wire.PREFIX.unpack_from(data)
            end = wire.PREFIX.size + header_len + payload_len
            self.queue.append(data[:end])
            data = data[end:]

    def receive(self, *, timeout_s: float):
        frame = self.queue.pop(0)
        request = wire.decode_frame(frame)
        started = time.thread_time()
        # One torch thread, as a sandbox worker runs (its zygote sets it): beside other
        # busy processes, two threads of this process waited on each other, and lab 5's
        # generate test ran past its 40 s here while the sandboxed grading passed.
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            reply = {"ok": self.server.handle(request)}
        except BaseException as exc:  # noqa: BLE001 - as the worker reports it
            reply = {"error": _worker_module().describe_exception(exc, str((paths.KIT / "solutions")))}
        finally:
            torch.set_num_threads(threads)
        spent = time.thread_time() - started
        self.handler_s += spent
        if self.zygote is not None:
            self.zygote.charge(self.server.lab, spent)
        reply.update(stdout="", forbidden=[])
        return wire.decode_frame(wire.encode(reply))

    def has_children(self) -> bool:
        return False

    def kill(self) -> None:
        self.alive = False


_calibrate = relay_cost.calibrate


def _calibrate_unless_in_process(worker):
    """The relay's framing rate (``relay_cost.calibrate``): nothing crosses a socket in
    this process, so nothing is taken off there (and there is no channel to calibrate)."""
    if isinstance(worker, InProcessWorker):
        return relay_cost.FramingRate()
    return _calibrate(worker)


relay_cost.calibrate = _calibrate_unless_in_process


class InProcessZygote:
    """``Zygote.spawn`` for ``InProcessWorker``; keeps the handler time of all its workers,
    and by (lab, test) of ``clock``'s key in force when set (else by the worker's lab)."""
    mode = "in-process"
    pid = None
    alive = True

    def __init__(self):
        self.workers: list[InProcessWorker] = []
        self.clock: LabClock | None = None
        self.handler_by_key: dict[tuple[str, str], float] = {}

    def charge(self, lab: str, seconds: float) -> None:
        key = self.clock.key if self.clock is not None else (lab, "")
        self.handler_by_key[key] = self.handler_by_key.get(key, 0.0) + seconds

    def spawn(self, *, submission: str, lab: str, forbidden: list[str],
              importable: dict | None = None, answered_by: str = "own") -> InProcessWorker:
        # ``importable`` needs no calls answered here: the reference lab modules import
        # each other.
        worker = InProcessWorker(lab, self)
        self.workers.append(worker)
        return worker

    @property
    def handler_s(self) -> float:
        return sum(w.handler_s for w in self.workers)

    def close(self) -> None:
        self.workers.clear()


TRAINING_FIGURE = re.compile(r"Your training: ([0-9.]+) of [0-9.]+ CPU seconds")
TOP_TESTS = 5                  # the costliest tests kept per lab


def training_cpu_s(text: str) -> float | None:
    """Lab 8's training CPU seconds in a report's text, as its worker's kernel accounting
    gave them (``grader/suites/_training.py``'s ``training_figures``); None if not there."""
    found = TRAINING_FIGURE.search(text or "")
    return float(found.group(1)) if found else None


def _result_training_cpu_s(result) -> float | None:
    for lab in result.labs:
        for test in lab.tests:
            if (seconds := training_cpu_s(test.message)) is not None:
                return seconds
    return None


def comparable(result) -> dict:
    """``result.to_dict_without_timings()`` less lab 8's training report: each training
    stops on its own clock, so its figures (CPU seconds, losses) differ from one training
    to the next, and the in-process worker's CPU reading is of an idle process."""
    data = result.to_dict_without_timings()
    for lab in data["labs"]:
        for test in lab["tests"]:
            if training_cpu_s(test["message"]) is not None:
                test["message"] = "(the training's own figures)"
    return data


def _settle(clock: LabClock, timeout_s: float = 5.0) -> None:
    """Until the zygote has reaped every worker of the grading (their exits are its CPU)."""
    deadline = time.monotonic() + timeout_s
    while clock.sandbox_pid is not None and clock.unreaped and time.monotonic() < deadline:
        time.sleep(0.01)
        clock.reading()


def measure(zygotes: dict, rubric, repeat: int, labs: list[str] | None = None) -> dict:
    """CPU seconds per grading of the solutions for each zygote, graded in alternation
    (on ``labs``, default: every lab of ``rubric``).

    Two warm-up gradings each; then ``repeat`` rounds of one grading per zygote, so that
    every way sees the same machine (its speed drifts over seconds). Torch runs one thread,
    as in a batch's grading process (a second one's spinning would count as CPU time).
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        graders = {name: Grader(Course(paths.KIT, rubric), zygote=zygote) for name, zygote in zygotes.items()}
        try:
            return _measure(zygotes, graders, repeat, labs)
        finally:
            for grader in graders.values():
                grader.close()
    finally:
        torch.set_num_threads(threads)


def _measure(zygotes: dict, graders: dict, repeat: int, labs: list[str] | None) -> dict:
    results, wall = {}, dict.fromkeys(zygotes, 0.0)
    spent: dict = {name: {} for name in zygotes}       # name -> (lab, test) -> CPU seconds
    training: dict = {name: [] for name in zygotes}
    for name in zygotes:
        for _ in range(2):
            graders[name].grade((paths.KIT / "solutions"), labs=labs)
    handler0 = {n: dict(z.handler_by_key) for n, z in zygotes.items()
                if isinstance(z, InProcessZygote)}
    for _ in range(repeat):
        for name, zygote in zygotes.items():
            # A clock of its own per grading: this process's CPU is both ways', so what one
            # way's clock reads between its gradings would be the other way's.
            clock = LabClock(zygote.pid, by_test=True)
            if isinstance(zygote, InProcessZygote):
                zygote.clock = clock
            wall0 = time.perf_counter()
            results[name] = graders[name].grade((paths.KIT / "solutions"), labs=labs, clock=clock)
            wall[name] += time.perf_counter() - wall0
            _settle(clock)          # the workers' exits are the grading's (outside the labs)
            for key, seconds in clock.take().items():
                spent[name][key] = spent[name].get(key, 0.0) + seconds
            if isinstance(zygote, InProcessZygote):
                zygote.clock = None
            training[name].append(_result_training_cpu_s(results[name]))
    figures = {}
    for name, zygote in zygotes.items():
        lab_code = None
        if name in handler0:        # only measurable in-process: a sandboxed worker's time is its own
            lab_code = {key: seconds - handler0[name].get(key, 0.0)
                        for key, seconds in zygote.handler_by_key.items()}
        figures[name] = {
            "cpu_per_submission_s": sum(spent[name].values()) / repeat,
            "wall_per_submission_s": wall[name] / repeat,
            "lab_code_per_submission_s": (sum(lab_code.values()) / repeat
                                          if lab_code is not None else None),
            **per_lab(spent[name], lab_code, repeat),
            # The worker's own figure (in-process the training runs in this process, and
            # its worker's accounting reads an idle one).
            "training_cpu_s": (None if name in handler0 or None in training[name]
                               else sum(training[name]) / repeat),
            "score": results[name].score}
    figures["same_report"] = len({json.dumps(comparable(r), sort_keys=True)
                                  for r in results.values()}) == 1
    return figures


def per_lab(spent: dict, lab_code: dict | None, repeat: int) -> dict:
    """CPU seconds per submission by lab (and the lab code's part, where measured), outside
    any lab, and each lab's costliest tests, from (lab, test) -> seconds over ``repeat``."""
    labs: dict[str, dict] = {}
    tests: dict[str, dict[str, list]] = {}
    for (lab, test), seconds in spent.items():
        if lab == OUTSIDE:
            continue
        labs.setdefault(lab, {"cpu_s": 0.0, "lab_code_s": None if lab_code is None else 0.0})
        labs[lab]["cpu_s"] += seconds / repeat
        tests.setdefault(lab, {})[test] = [seconds / repeat, None]
    for (lab, test), seconds in (lab_code or {}).items():
        if lab in labs and (lab, test) in spent:        # not a warm-up's (no clock then)
            labs[lab]["lab_code_s"] += seconds / repeat
            tests[lab].setdefault(test, [0.0, None])[1] = seconds / repeat
    top = {lab: [{"test": test, "cpu_s": cpu, "lab_code_s": code}
                 for test, (cpu, code) in sorted(by_test.items(), key=lambda kv: -kv[1][0])
                 [:TOP_TESTS]]
           for lab, by_test in tests.items()}
    return {"by_lab": labs, "outside_labs_cpu_s": spent.get((OUTSIDE, ""), 0.0) / repeat,
            "outside_labs_lab_code_s": (None if lab_code is None
                                        else lab_code.get((OUTSIDE, ""), 0.0) / repeat),
            "top_tests": top}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    rubric = load_rubric((paths.KIT / "rubric.yaml"))
    with Zygote(forbidden=rubric.all_forbidden) as zygote:
        measured = measure({"sandboxed": zygote, "in_process": InProcessZygote()}, rubric,
                           args.repeat)
    figures = {"repeat": args.repeat, "max_score": rubric.max_points, **measured}
    text = json.dumps(figures, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
