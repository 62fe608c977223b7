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
lab code itself, the scores, and whether both ways gave the same report. A shared VM's
speed drifts (by up to 1.5x over minutes here): the two ways are measured in alternation, so
their ratio holds even when the absolute figures move.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import resource
import sys
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from grader import paths  # noqa: E402
from grader.course import Course  # noqa: E402
from grader.batch.pool import cpu_seconds  # noqa: E402
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

    def __init__(self, lab: str):
        self.server = _reference_server()(None, {"lab": lab, "folder": str((paths.KIT / "solutions"))})
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
        self.handler_s += time.thread_time() - started
        reply.update(stdout="", forbidden=[])
        return wire.decode_frame(wire.encode(reply))

    def has_children(self) -> bool:
        return False

    def kill(self) -> None:
        self.alive = False


class InProcessZygote:
    """``Zygote.spawn`` for ``InProcessWorker``; keeps the handler time of all its workers."""
    mode = "in-process"
    pid = None
    alive = True

    def __init__(self):
        self.workers: list[InProcessWorker] = []

    def spawn(self, *, submission: str, lab: str, forbidden: list[str],
              importable: dict | None = None, answered_by: str = "own") -> InProcessWorker:
        # ``importable`` needs no calls answered here: the reference lab modules import
        # each other.
        worker = InProcessWorker(lab)
        self.workers.append(worker)
        return worker

    @property
    def handler_s(self) -> float:
        return sum(w.handler_s for w in self.workers)

    def close(self) -> None:
        self.workers.clear()


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _sandbox_cpu(zygote) -> float:
    """CPU seconds of the zygote and the workers it reaped (0 for an in-process one)."""
    if getattr(zygote, "pid", None) is None:
        return 0.0
    return cpu_seconds(zygote.pid) - _own_cpu()


def _wait_reaped(zygote, timeout_s: float = 5.0) -> None:
    """Until the zygote has reaped every worker (so their CPU time is in its account)."""
    pid = getattr(zygote, "pid", None)
    deadline = time.monotonic() + timeout_s
    while pid is not None and time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as fh:
                if not fh.read().split():
                    return
        except OSError:
            return
        time.sleep(0.02)


def measure(zygotes: dict, rubric, repeat: int) -> dict:
    """CPU seconds per grading of the solutions for each zygote, graded in alternation.

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
            return _measure(zygotes, graders, repeat)
        finally:
            for grader in graders.values():
                grader.close()
    finally:
        torch.set_num_threads(threads)


def _measure(zygotes: dict, graders: dict, repeat: int) -> dict:
    results, cpu, wall = {}, dict.fromkeys(zygotes, 0.0), dict.fromkeys(zygotes, 0.0)
    for name in zygotes:
        for _ in range(2):
            graders[name].grade((paths.KIT / "solutions"))
    handler0 = {n: z.handler_s for n, z in zygotes.items() if isinstance(z, InProcessZygote)}
    # A zygote reaps (and so is charged for) a worker a moment after its grading ends: its
    # CPU is taken over the whole run, during which it works for its own gradings only.
    sandbox0 = {n: _sandbox_cpu(z) for n, z in zygotes.items()}
    for _ in range(repeat):
        for name in zygotes:
            cpu0, wall0 = _own_cpu(), time.perf_counter()
            results[name] = graders[name].grade((paths.KIT / "solutions"))
            cpu[name] += _own_cpu() - cpu0
            wall[name] += time.perf_counter() - wall0
    for name, zygote in zygotes.items():
        _wait_reaped(zygote)
        cpu[name] += _sandbox_cpu(zygote) - sandbox0[name]
    figures = {}
    for name, zygote in zygotes.items():
        figures[name] = {
            "cpu_per_submission_s": cpu[name] / repeat,
            "wall_per_submission_s": wall[name] / repeat,
            # Only measurable in-process: a sandboxed worker's time is its own.
            "lab_code_per_submission_s": ((zygote.handler_s - handler0[name]) / repeat
                                          if name in handler0 else None),
            "score": results[name].score}
    figures["same_report"] = len({json.dumps(r.to_dict_without_timings(), sort_keys=True)
                                  for r in results.values()}) == 1
    return figures


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
