"""How long a student waits for ``grader check``: cold runs, each in a fresh interpreter.

    .venv/bin/python benchmarks/bench_check.py                 # 5 runs of each case
    .venv/bin/python benchmarks/bench_check.py --repeat 1      # quick
    .venv/bin/python benchmarks/bench_check.py --cases buggy --repeat 9 --json figures.json

    .venv/bin/python benchmarks/bench_check.py --cases each-lab --repeat 1   # one-lab checks
    .venv/bin/python benchmarks/bench_check.py --cases lab1_attention --backends portable

Backends (``--backends``, default both, side by side in one run): ``jail``, the default
sandbox (GRADER_SANDBOX_MODE unset), and ``portable`` (GRADER_SANDBOX_MODE=portable: what
macOS and Windows run, #40; its goal: a one-lab check of labs 1-7 in at most 5 s wall on a
quiet machine). Each case runs on each backend in turn, within one round.

Cases (the public suites, as a student runs them):

- ``solutions``: every lab's reference solution copied to a temporary folder, all labs;
- ``stubs``: ``exercises/`` (every test fails: "not implemented yet");
- ``buggy``: ``tests/fixtures/submissions/bug_softmax_dim`` (failed tests, each diagnosed);
- ``lab1_attention`` ... ``lab8_train_transformer`` (``each-lab``: all eight): a one-lab
  check, ``grader check FOLDER --lab LAB`` on the solutions' folder, as a student checks the
  lab they work on.

Each round runs every case once, in turn (alternation keeps a shared machine's drift out of
the comparison between cases), as ``grader check DIR`` in a subprocess: the wall time of
the whole command, interpreter start to exit. Then, per case, ``--breakdown`` more runs
(default: up to 3) of the same command with a timeline recorded in the child (this script's
``--child`` mode: import hooks and wrappers around the grader's own functions, nothing
changed in what runs), reported as medians of when each phase starts and ends, since the
subprocess was started:

- ``cli``: the interpreter and ``grader.cli`` until the command starts;
- ``import torch`` (the grading process's), ``zygote``: the sandbox zygote from its launch
  to its hello (with the zygote's own figures: its imports, torch warm-up, heap settling);
- ``pytest``: the pytest session from its start until its suites are collected;
- ``grading``: the submission (each lab's import in a worker, then the tests), of which
  ``tests`` is the pytest run and ``diagnoses`` the mistake catalogue's replays;
- ``output``: the terminal table; ``exit``: from the end of ``main`` to the process's end.

The machine's load average is printed at the start and the end: on a shared machine, wall
times depend on it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LABS = tuple(sorted(p.stem for p in (ROOT / "solutions").glob("lab*.py")))
CASES = ("solutions", "stubs", "buggy", *LABS)
BUGGY = ROOT / "tests" / "fixtures" / "submissions" / "bug_softmax_dim"
BACKENDS = ("jail", "portable")
PORTABLE_GOAL_S = 5.0       # a cold one-lab check, labs 1-7, quiet machine (#40)


def backend_env(backend: str) -> dict[str, str]:
    """The environment of a run on ``backend``: the jail is the default (no variable)."""
    env = {k: v for k, v in os.environ.items() if k != "GRADER_SANDBOX_MODE"}
    if backend == "portable":
        env["GRADER_SANDBOX_MODE"] = "portable"
    return env


# --------------------------------------------------------------------------------------------
# the parent: runs and figures
# --------------------------------------------------------------------------------------------

def case_folders(tmp: Path) -> dict[str, Path]:
    solutions = tmp / "solutions"
    solutions.mkdir()
    for f in sorted((ROOT / "solutions").glob("lab*.py")):
        shutil.copy(f, solutions / f.name)
    return {"solutions": solutions, "stubs": ROOT / "exercises", "buggy": BUGGY,
            **{lab: solutions for lab in LABS}}


def check_args(case: str, folder: Path, labs: list[str] | None = None) -> list[str]:
    """``grader check``'s arguments for a case (a lab's name: that lab only; else ``labs``,
    default: every lab)."""
    only = [case] if case in LABS else labs or []
    return [str(folder), *(["--lab", ",".join(only)] if only else [])]


def grader_command() -> list[str]:
    """The installed ``grader`` script next to this interpreter, else ``python -m grader.cli``."""
    script = Path(sys.executable).with_name("grader")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "grader.cli"]


def run_plain(args: list[str], backend: str = "jail") -> tuple[float, int, str]:
    """One cold ``grader check ARGS``: (wall seconds, exit status, stdout)."""
    t0 = time.perf_counter()
    proc = subprocess.run([*grader_command(), "check", *args], capture_output=True,
                          text=True, cwd=ROOT, env=backend_env(backend))
    return time.perf_counter() - t0, proc.returncode, proc.stdout + proc.stderr


def run_timed(args: list[str], tmp: Path, backend: str = "jail") -> tuple[float, int, dict]:
    """One cold ``grader check ARGS`` through ``--child``: (wall, status, timeline)."""
    out = tmp / "timeline.json"
    t0_wall = time.time()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(args), "--t0",
                           repr(t0_wall), "--timeline", str(out)], capture_output=True,
                          text=True, cwd=ROOT, env=backend_env(backend))
    wall = time.perf_counter() - t0
    timeline = json.loads(out.read_text()) if out.is_file() else {}
    out.unlink(missing_ok=True)
    timeline["exit_end"] = wall
    return wall, proc.returncode, timeline


def check_output(case: str, rc: int, text: str) -> None:
    expected = {"stubs": 1, "buggy": 1}.get(case, 0)
    if rc != expected or "Total:" not in text:
        raise SystemExit(f"grader check on {case}: exit status {rc}, expected {expected}:\n"
                         f"{text[-2000:]}")


def phases(t: dict) -> list[tuple[str, float | None, float | None, str]]:
    """(phase, start, end, note) from one timeline (seconds since the subprocess started)."""
    z = t.get("zygote_timings") or {}
    znote = ", ".join(f"{k} {v:.2f} s" for k, v in z.items())
    diag = t.get("diagnoses_s")
    return [
        ("cli", 0.0, t.get("command_start"), "interpreter + grader.cli, until the command runs"),
        ("import torch", t.get("torch_start"), t.get("torch_end"), "in the grading process"),
        ("zygote", t.get("zygote_start"), t.get("zygote_end"),
         f"launch to hello ({znote})" if znote else "launch to hello"),
        ("pytest", t.get("pytest_start"), t.get("pytest_collected"),
         "session start + collection"),
        ("grading", t.get("grading_start"), t.get("grading_end"),
         "labs' imports in workers + tests"),
        ("tests", t.get("tests_start"), t.get("tests_end"),
         f"of which diagnoses {diag:.2f} s ({int(t.get('diagnoses', 0))} failed tests)"
         if diag else "the pytest run"),
        ("output", t.get("output_start"), t.get("output_end"), "the terminal table"),
        ("exit", t.get("main_end"), t.get("exit_end"), "main() returned -> process gone"),
    ]


def median_timeline(timelines: list[dict]) -> dict:
    keys = {k for t in timelines for k, v in t.items() if isinstance(v, (int, float))}
    out = {k: statistics.median([t[k] for t in timelines if isinstance(t.get(k), (int, float))])
           for k in keys}
    ztimings: dict[str, list[float]] = {}
    for t in timelines:
        for k, v in (t.get("zygote_timings") or {}).items():
            ztimings.setdefault(k, []).append(v)
    out["zygote_timings"] = {k: statistics.median(v) for k, v in ztimings.items()}
    return out


def fmt(x: float | None) -> str:
    return "   -  " if x is None else f"{x:6.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="plain runs per case (default 5)")
    parser.add_argument("--breakdown", type=int, default=None,
                        help="timeline runs per case (default: min(repeat, 3); 0: none)")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated, of {', '.join(CASES)}, each-lab")
    parser.add_argument("--labs", help="comma-separated: the solutions, stubs and buggy cases "
                                       "check only these labs (default: every lab)")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated, of jail (the default sandbox), portable "
                             "(GRADER_SANDBOX_MODE=portable); default both, side by side")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--timeline", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.t0, args.timeline)
    cases = [lab for c in args.cases.split(",") if c
             for lab in (LABS if c == "each-lab" else (c,))]
    for c in cases:
        if c not in CASES:
            parser.error(f"unknown case {c!r}")
    labs = [lab for lab in (args.labs or "").split(",") if lab]
    for lab in labs:
        if lab not in LABS:
            parser.error(f"unknown lab {lab!r}")
    backends = [b for b in args.backends.split(",") if b]
    for b in backends:
        if b not in BACKENDS:
            parser.error(f"unknown backend {b!r}")
    breakdown = min(args.repeat, 3) if args.breakdown is None else args.breakdown
    load_start = os.getloadavg()
    print(f"grader check, cold, {args.repeat} run(s) per case and backend "
          f"({', '.join(backends)}), {os.cpu_count()} CPUs; "
          f"load average at start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}",
          flush=True)
    # "cases": the first backend's (the jail's by default); "backends": every backend's.
    figures: dict = {"repeat": args.repeat, "load_start": load_start, "cases": {},
                     "backends": {b: {"cases": {}} for b in backends}}
    with tempfile.TemporaryDirectory(prefix="bench-check-") as tmp_name:
        tmp = Path(tmp_name)
        folders = case_folders(tmp)
        walls: dict[tuple[str, str], list[float]] = {(b, c): [] for b in backends for c in cases}
        for _ in range(args.repeat):
            for case in cases:
                for b in backends:
                    wall, rc, text = run_plain(check_args(case, folders[case], labs), b)
                    check_output(case, rc, text)
                    walls[b, case].append(wall)
        timelines: dict[tuple[str, str], list[dict]] = {k: [] for k in walls}
        for _ in range(breakdown):
            for case in cases:
                for b in backends:
                    _, rc, timeline = run_timed(check_args(case, folders[case], labs), tmp, b)
                    check_output(case, rc, "Total:" if timeline.get("output_end") else "")
                    timelines[b, case].append(timeline)
    load_end = os.getloadavg()
    figures["load_end"] = load_end
    width = max(10, *(len(c) for c in cases))
    # Side by side: per backend the median, min and max wall seconds of the case's runs.
    print(f"\n{'case':<{width}} " + " ".join(f"{b + ' median':>16} {'min':>6} {'max':>6}"
                                            for b in backends)
          + ("   portable/jail" if backends == list(BACKENDS) else "") + "   runs (s)")
    for case in cases:
        row = f"{case:<{width}} "
        for b in backends:
            w = walls[b, case]
            row += f"{statistics.median(w):16.2f} {min(w):6.2f} {max(w):6.2f} "
            fig = {"median_s": statistics.median(w), "min_s": min(w), "max_s": max(w),
                   "runs_s": w}
            figures["backends"][b]["cases"][case] = fig
            if b == backends[0]:
                figures["cases"][case] = fig
        if backends == list(BACKENDS):
            ratio = statistics.median(walls["portable", case]) / statistics.median(
                walls["jail", case])
            row += f"  {ratio:13.2f}x"
        print(row + "   " + " | ".join(" ".join(f"{x:.2f}" for x in walls[b, case])
                                       for b in backends))
    if "portable" in backends:
        one_lab = [c for c in cases if c in LABS and c != "lab8_train_transformer"]
        over = [c for c in one_lab
                if statistics.median(walls["portable", c]) > PORTABLE_GOAL_S]
        if one_lab:
            print(f"portable one-lab checks (labs 1-7) over {PORTABLE_GOAL_S:g} s wall: "
                  + (", ".join(over) if over else "none")
                  + f" (load average now {os.getloadavg()[0]:.2f}; the goal is for a quiet "
                    "machine)")
    for b in backends:
        for case in cases:
            if not timelines[b, case]:
                continue
            t = median_timeline(timelines[b, case])
            figures["backends"][b]["cases"][case]["timeline"] = t
            label = case if b == backends[0] else f"{case} ({b})"
            print(f"\n{label}: where the time goes (median of {len(timelines[b, case])} timed "
                  "run(s); seconds since the subprocess started; phases overlap)")
            print(f"  {'phase':<14}{'start':>7}{'end':>7}{'took':>7}  what")
            for name, start, end, note in phases(t):
                took = None if start is None or end is None else end - start
                print(f"  {name:<14}{fmt(start)} {fmt(end)} {fmt(took)}  {note}")
    print(f"\nload average at end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


# --------------------------------------------------------------------------------------------
# the child: ``grader check`` with a timeline
# --------------------------------------------------------------------------------------------

def child(check_args_json: str, t0: float, timeline_path: str) -> int:
    """Run ``grader check ARGS`` (a JSON list) in this fresh interpreter, recording when each phase
    starts and ends (seconds since ``t0``, the parent's clock when it started us). Only
    hooks: an import hook that times ``torch`` and wraps the grader's functions as their
    modules finish loading; what runs is ``grader.cli.main``."""
    import functools
    import importlib.abc
    import importlib.machinery

    tl: dict = {"diagnoses_s": 0.0, "diagnoses": 0}

    def now() -> float:
        return time.time() - t0

    def first(key: str) -> None:
        tl.setdefault(key, now())

    def timed(fn, start: str | None, end: str | None, *, total: str | None = None,
              count: str | None = None):
        @functools.wraps(fn)
        def wrapper(*a, **kw):
            t = now()
            if start:
                tl.setdefault(start, t)
            try:
                return fn(*a, **kw)
            finally:
                if end:
                    tl[end] = now()
                if total:
                    tl[total] += now() - t
                if count:
                    tl[count] += 1
        return wrapper

    def patch_host(m):
        zyg = m.Zygote
        launch = getattr(zyg, "launch", None)
        if launch is not None:           # the zygote may be launched before it is waited for
            zyg.launch = timed(launch, "zygote_start", None)
        original_start = zyg.start

        @functools.wraps(original_start)
        def start(self, *a, **kw):
            tl.setdefault("zygote_start", now())
            try:
                return original_start(self, *a, **kw)
            finally:
                tl.setdefault("zygote_end", now())
                if getattr(self, "timings", None):
                    tl["zygote_timings"] = dict(self.timings)
        zyg.start = start

    def patch_runner(m):
        r = m.SuiteRunner
        r.start = timed(r.start, "pytest_start", None)
        loop = r.pytest_runtestloop

        @functools.wraps(loop)
        def pytest_runtestloop(self, session):
            tl.setdefault("pytest_collected", now())
            return loop(self, session)
        # pluggy reads the hook's options from the function: keep them.
        pytest_runtestloop.__dict__.update(loop.__dict__)
        r.pytest_runtestloop = pytest_runtestloop
        r.run = timed(r.run, "tests_start", "tests_end")

    def patch(name: str, m) -> None:
        if name == "grader.sandbox.host":
            patch_host(m)
        elif name == "grader.engine.suite_runner":
            patch_runner(m)
        elif name == "grader.grading":
            m.Grader._grade_clean = timed(m.Grader._grade_clean, "grading_start", "grading_end")
        elif name == "grader.diagnose":
            # The grading plugin's entry into the diagnosis (``examine`` wraps it).
            m.examine_candidates = timed(m.examine_candidates, None, None, total="diagnoses_s",
                                         count="diagnoses")
        elif name == "grader.outputs.terminal":
            m.render_table = timed(m.render_table, "output_start", "output_end")
        elif name == "grader.cli.check":
            m.cmd_check = timed(m.cmd_check, "command_start", None)

    watched = {"torch", "grader.sandbox.host", "grader.engine.suite_runner", "grader.grading",
               "grader.diagnose", "grader.outputs.terminal", "grader.cli.check"}

    class Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name not in watched:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path, target)
            if spec is None or spec.loader is None:
                return None
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                if name == "torch":
                    tl["torch_start"] = now()
                exec_module(module)
                if name == "torch":
                    tl["torch_end"] = now()
                patch(name, module)
            spec.loader.exec_module = exec_and_patch
            return spec

    sys.meta_path.insert(0, Hook())
    sys.argv = ["grader", "check", *json.loads(check_args_json)]
    import grader.cli
    rc = 3
    try:
        rc = grader.cli.main()
    finally:
        tl["main_end"] = now()
        Path(timeline_path).write_text(json.dumps(tl))
    return rc


if __name__ == "__main__":
    sys.exit(main())
