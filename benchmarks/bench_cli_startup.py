#!/usr/bin/env python3
"""How long ``grader --help`` and ``grader <command> --help`` take (target: under 0.5 s).

They build the parser only: no command module may import torch (or the grading engine)
at import time. Prints the median wall-clock time of a few fresh processes per command,
and the same for ``python -c pass`` (the interpreter's own start-up) for comparison.

    python benchmarks/bench_cli_startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = [["--help"], ["--version"], ["check", "--help"], ["batch", "--help"],
            ["grade", "--help"]]
TARGET_S = 0.5


def timed(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    base = timed([sys.executable, "-c", "pass"], args.runs)
    print(f"{'python -c pass':<28} {base:6.3f} s (the interpreter alone)")
    worst = 0.0
    for command in COMMANDS:
        t = timed([sys.executable, "-m", "grader.cli", *command], args.runs)
        worst = max(worst, t)
        print(f"{'grader ' + ' '.join(command):<28} {t:6.3f} s")
    print(f"slowest: {worst:.3f} s ({'within' if worst < TARGET_S else 'OVER'} the "
          f"{TARGET_S:g} s target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
