"""Benchmark ``grader batch --scheduler``: a local Dask cluster against the local pool.

    .venv/bin/python benchmarks/bench_cluster.py                  # 24 students, every lab
    .venv/bin/python benchmarks/bench_cluster.py --students 12 --lab lab1_attention

One class (benchmarks/bench_batch.py's: 70% correct, 20% one bug, 10% broken, every fifth
a .zip) is graded four ways, each into a fresh folder, one after the other:

- the local pool with 1 and with 2 grading processes (``grade_batch(jobs=...)``);
- a Dask cluster on this machine (a scheduler and 1, then 2, worker processes with
  ``--nthreads 1``, started before the clock starts, as a cluster is before a batch),
  through ``grade_batch(scheduler=...)``, twice: cold (the workers' first batch: each
  imports torch and the engine) and warm (the next batch, as on a cluster that has
  graded before).

Each time counts from the call to the gradebook written, start-up included (the local
pool's forkserver and Graders; the workers' Graders, started by the batch's plugin). The
gradebooks must match the local one (grades.csv byte for byte). It prints students per
minute, the overhead per student of the distributed path, the CPU time per student of
the client (this process, all of it: listing, reading and sending submissions, writing
files, the gradebook) and of the scheduler (beyond its idle ticking, measured for 5 s
before each cluster run), and a projection for N machines as arithmetic from those figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_batch import build_class  # noqa: E402

from grader.batch import grade_batch  # noqa: E402
from grader import paths  # noqa: E402
from grader.course import Course  # noqa: E402


IDLE_S = 5.0                 # seconds the idle scheduler is watched before each cluster run


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class LocalCluster:
    """A dask scheduler and ``workers`` worker processes (nanny each), stopped by pid."""

    def __init__(self, folder: Path, workers: int):
        from distributed import Client
        self.procs: list[subprocess.Popen] = []
        folder.mkdir(parents=True, exist_ok=True)
        file = folder / "scheduler.json"
        self._start(folder, "scheduler", ["distributed.cli.dask_scheduler", "--host",
                                          "127.0.0.1", "--port", "0", "--no-dashboard",
                                          "--scheduler-file", str(file)])
        deadline = time.monotonic() + 300
        while not file.exists() or not file.read_text().strip().endswith("}"):
            if time.monotonic() > deadline:
                raise RuntimeError("the scheduler did not start")
            time.sleep(0.2)
        self.address = json.loads(file.read_text())["address"]
        self.scheduler_pid = self.procs[0].pid
        for i in range(workers):
            self._start(folder, f"worker{i}", [
                "distributed.cli.dask_worker", self.address, "--nworkers", "1",
                "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard",
                "--memory-limit", "0", "--death-timeout", "120"])
        self.client = Client(self.address, timeout=60, set_as_default=False)
        self.client.wait_for_workers(workers, timeout=300)

    def _start(self, folder: Path, name: str, argv: list[str]) -> None:
        with open(folder / f"{name}.log", "wb") as log:
            self.procs.append(subprocess.Popen([sys.executable, "-m", *argv], stdout=log,
                                               stderr=subprocess.STDOUT, env=_env()))

    def close(self) -> None:
        self.client.close(timeout=10)
        for proc in reversed(self.procs):
            proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def timed(root: Path, out: Path, labs, **how) -> dict:
    cpu, started = _self_cpu(), time.monotonic()
    summary = grade_batch(root, out=out, course=Course(paths.KIT), progress=False, labs=labs, **how)
    seconds = time.monotonic() - started
    return {"seconds": seconds, "client_cpu_s": _self_cpu() - cpu,
            "students": summary.students, "graded": summary.graded,
            "per_minute": summary.graded / seconds * 60,
            "grades_csv": (out / "grades.csv").read_bytes()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=24)
    parser.add_argument("--lab", dest="labs", action="append",
                        help="grade only this lab (repeat; default: every lab)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    figures: dict = {"students": args.students, "labs": args.labs or "all",
                     "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        work = Path(tmp)
        root = work / "class"
        root.mkdir()
        build_class(root, args.students)
        print(f"{args.students} students, labs: {', '.join(args.labs or ['all'])}; "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)
        runs = {}
        for k in (1, 2):          # each pair side by side: a shared machine's speed drifts
            name = f"local pool, {k} process(es)"
            runs[name] = timed(root, work / f"local{k}", args.labs, jobs=k)
            print(f"  {name}: {runs[name]['seconds']:.1f} s", flush=True)
            cluster = LocalCluster(work / f"dask{k}", k)
            try:
                # The scheduler's own ticking (heartbeats), measured idle, is not per student.
                idle_from, idle_cpu = time.monotonic(), _cpu_of(cluster.scheduler_pid)
                time.sleep(IDLE_S)
                idle_rate = (_cpu_of(cluster.scheduler_pid) - idle_cpu) / (time.monotonic()
                                                                           - idle_from)
                # Cold: the workers' first batch (each imports torch and the engine);
                # warm: the next one, as on a cluster that has graded before.
                for state in ("cold", "warm"):
                    before = _cpu_of(cluster.scheduler_pid)
                    run = timed(root, work / f"dask{k}" / state, args.labs,
                                scheduler=cluster.address)
                    run["scheduler_cpu_s"] = max(0.0, _cpu_of(cluster.scheduler_pid) - before
                                                 - idle_rate * run["seconds"])
                    run["scheduler_idle_cpu_per_s"] = idle_rate
                    name = f"dask, {k} worker(s), {state}"
                    runs[name] = run
                    print(f"  {name}: {run['seconds']:.1f} s", flush=True)
            finally:
                cluster.close()

    reference = runs["local pool, 1 process(es)"]["grades_csv"]
    for run in runs.values():
        run["same_grades_csv"] = run.pop("grades_csv") == reference
    print()
    print(f"{'how':<34}{'seconds':>9}{'students/min':>14}{'client CPU-s/student':>22}"
          f"{'same grades.csv':>17}")
    for name, run in runs.items():
        print(f"{name:<34}{run['seconds']:>9.1f}{run['per_minute']:>14.1f}"
              f"{run['client_cpu_s'] / max(1, run['graded']):>22.3f}"
              f"{'yes' if run['same_grades_csv'] else 'NO':>17}")
    n = max(1, runs["local pool, 1 process(es)"]["graded"])
    for k, state in ((1, "cold"), (1, "warm"), (2, "cold"), (2, "warm")):
        run_name = f"dask, {k} worker(s), {state}"
        local, dask = runs[f"local pool, {k} process(es)"], runs[run_name]
        overhead = (dask["seconds"] - local["seconds"]) / n * k
        print(f"overhead of the distributed path, {k} worker(s), {state}: "
              f"{dask['seconds'] - local['seconds']:+.1f} s over {n} students = "
              f"{overhead:+.3f} worker-s per student; scheduler "
              f"{runs[run_name]['scheduler_cpu_s'] / n * 1000:.1f} CPU-ms per student (beyond "
              f"its idle {runs[run_name]['scheduler_idle_cpu_per_s'] * 1000:.0f} CPU-ms/s)")
        figures[f"overhead_worker_s_per_student_{k}_{state}"] = overhead

    # The projection: arithmetic from the figures above, nothing more.
    two = runs["dask, 2 worker(s), warm"]
    per_machine = two["per_minute"]                # one 2-core machine, 2 warm workers
    client = two["client_cpu_s"] / n                        # the client's CPU per student
    scheduler = two["scheduler_cpu_s"] / n
    ceiling = 60 / max(client, scheduler, 1e-9)
    print()
    print(f"projection for N machines like this one (2 warm workers each): N x {per_machine:.1f} "
          f"students/min, until the client ({client * 1000:.1f} CPU-ms per student) or the "
          f"scheduler ({scheduler * 1000:.1f} CPU-ms per student) is busy all the time: at "
          f"most 60 / {max(client, scheduler):.4f} = {ceiling:.0f} students/min, so up to "
          f"about N = {ceiling / per_machine:.0f} machines scale linearly.")
    for machines in (1, 4, 16, 64):
        print(f"  N = {machines:>2}: {min(machines * per_machine, ceiling):8.1f} students/min "
              f"(1,000 students in {1000 / min(machines * per_machine, ceiling):5.1f} min)")
    figures.update(runs=runs, per_machine_per_minute=per_machine, client_cpu_s=client,
                   scheduler_cpu_s=scheduler, ceiling_per_minute=ceiling)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if all(run["same_grades_csv"] for run in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
