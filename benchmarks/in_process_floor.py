"""The suites' own cost: grade the reference solutions with and without the sandbox.

    .venv/bin/python benchmarks/in_process_floor.py [--repeat 20] [--json out.json]

Grades ``solutions/`` ``--repeat`` times in one warm process with one ``SuiteRunner`` (as
a batch's grading process does), twice over:

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
lab code itself, the scores, and whether both ways gave the same report.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from grader import paths  # noqa: E402
from grader.batch import cpu_seconds  # noqa: E402
from grader.grading import grade_submission  # noqa: E402
from grader.reference import load_reference  # noqa: E402
from grader.rubric import load_rubric  # noqa: E402
from grader.sandbox import Zygote, wire  # noqa: E402
from grader.suite_runner import SuiteRunner  # noqa: E402


def _worker_module():
    """grader/sandbox/worker.py, imported as the zygote imports it (by its folder)."""
    if "worker" in sys.modules and hasattr(sys.modules["worker"], "Server"):
        return sys.modules["worker"]
    folder = str(Path(paths.__file__).parent / "sandbox")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module("worker")
    finally:
        sys.path.remove(folder)


class InProcessWorker:
    """A ``host.Worker`` stand-in that answers in this process, on the reference modules.

    Requests and replies still cross ``wire`` (encoded and decoded), so the trusted side
    does the same work as with a real worker.
    """

    def __init__(self, lab: str):
        server_class = _worker_module().Server

        class ReferenceServer(server_class):
            def lab_module(self):
                return load_reference(self.lab)

        self.server = ReferenceServer(None, {"lab": lab, "folder": str(paths.SOLUTIONS)})
        self.alive, self.pid = True, 0
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
        request = _decode(frame)
        started = time.thread_time()
        try:
            reply = {"ok": self.server.handle(request)}
        except BaseException as exc:  # noqa: BLE001 - as the worker reports it
            reply = {"error": _worker_module().describe_exception(exc, str(paths.SOLUTIONS))}
        self.handler_s += time.thread_time() - started
        reply.update(stdout="", forbidden=[])
        return _decode(wire.encode(reply))

    def has_children(self) -> bool:
        return False

    def kill(self) -> None:
        self.alive = False


def _decode(frame: bytes):
    header_len, payload_len = wire.PREFIX.unpack_from(frame)
    header = frame[wire.PREFIX.size:wire.PREFIX.size + header_len]
    return wire.decode(bytes(header), bytearray(frame[wire.PREFIX.size + header_len:][:payload_len]))


class InProcessZygote:
    """``Zygote.spawn`` for ``InProcessWorker``; keeps the handler time of all its workers."""
    mode = "in-process"
    pid = None

    def __init__(self):
        self.workers: list[InProcessWorker] = []

    def spawn(self, *, submission: str, lab: str, forbidden: list[str]) -> InProcessWorker:
        worker = InProcessWorker(lab)
        self.workers.append(worker)
        return worker

    @property
    def handler_s(self) -> float:
        return sum(w.handler_s for w in self.workers)

    def close(self) -> None:
        self.workers.clear()


def measure(zygote, runner, rubric, repeat: int) -> dict:
    """CPU seconds per grading of the solutions (after two warm-up gradings)."""
    for _ in range(2):
        result = grade_submission(paths.SOLUTIONS, rubric=rubric, zygote=zygote, runner=runner)
    in_process = isinstance(zygote, InProcessZygote)
    handler0 = zygote.handler_s if in_process else 0.0
    cpu0, wall0 = cpu_seconds(zygote), time.perf_counter()
    for _ in range(repeat):
        result = grade_submission(paths.SOLUTIONS, rubric=rubric, zygote=zygote, runner=runner)
    return {"cpu_per_submission_s": (cpu_seconds(zygote) - cpu0) / repeat,
            "wall_per_submission_s": (time.perf_counter() - wall0) / repeat,
            # Only measurable in-process: a sandboxed worker's time is its own.
            "lab_code_per_submission_s": ((zygote.handler_s - handler0) / repeat
                                          if in_process else None),
            "score": result.score, "result": result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)        # as a batch's grading process runs
    rubric = load_rubric(paths.RUBRIC)
    forbidden = tuple(sorted({f for lab in rubric.labs.values() for f in lab.forbidden}))
    with SuiteRunner(rubric=rubric) as runner:
        with Zygote(forbidden=forbidden) as zygote:
            sandboxed = measure(zygote, runner, rubric, args.repeat)
        in_process = measure(InProcessZygote(), runner, rubric, args.repeat)
    same = _comparable(sandboxed.pop("result")) == _comparable(in_process.pop("result"))
    figures = {"repeat": args.repeat, "max_score": rubric.max_points,
               "sandboxed": sandboxed, "in_process": in_process, "same_report": same}
    text = json.dumps(figures, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


def _comparable(result) -> dict:
    data = result.to_dict()
    data.pop("execution_time", None)
    for lab in data.get("labs", []):
        for test in lab.get("tests", []):
            test.pop("duration_s", None)
    return data


if __name__ == "__main__":
    sys.exit(main())
