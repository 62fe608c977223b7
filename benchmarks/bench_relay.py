"""What a lab's calls into another lab are charged, by the bytes each call moves.

A lab 2 that does no work of its own calls lab 1's ``scaled_dot_product_attention`` (the
course's reference answers, in a reference worker) ``--calls`` times with one query over
K keys, for several K. Prints, per size: the MiB its calls moved, the worker's CPU time
with the answers' (what a measured call was charged before the relay's framing was taken
off), what is taken off (``relay_s``, at the rate ``engine.relay_cost`` calibrated), what
is charged, and the charged time against the smallest size's (1.0: moving bytes costs the
student nothing). Each figure is the least of ``--repeat`` measured calls.

    .venv/bin/python benchmarks/bench_relay.py [--calls 96] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

KIT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(KIT))

# Also the lab of tests/test_lab_imports.py::test_a_measured_calls_relay_framing_is_not_...
RELAYING = """
import torch
from lab1_attention import scaled_dot_product_attention


def relay(keys, calls):
    q = torch.zeros(1, 1, 64)
    k = torch.zeros(1, int(keys), 64)
    for _ in range(int(calls)):
        scaled_dot_product_attention(q, k, k)
    return torch.zeros(1)
"""
KEYS = (16, 1024, 8192)         # 8 kB, 512 kB and 4 MiB of keys and values a call


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    from grader import paths
    from grader.course import Course
    from grader.engine.student import Session
    from grader.grading import Grader
    from grader.rubric import load_rubric
    from grader.sandbox import make_scratch, protocol

    rubric = load_rubric(paths.KIT / "rubric.yaml")
    with Grader(Course(paths.KIT, rubric)) as grader:
        submission = make_scratch({"lab2_multihead.py": RELAYING.encode()})
        reference = make_scratch({f.name: f.read_bytes()
                                  for f in (paths.KIT / "solutions").glob("lab*.py")})
        session = Session(zygote=grader._zygote, submission_dir=submission.name, forbidden={},
                          importable=grader._importable, reference_dir=reference.name)
        rows = []
        try:
            for keys in KEYS:
                best = None
                for _ in range(args.repeat):
                    session.start_test(120, test="bench", lab="lab2_multihead")
                    _, used = session.measure("lab2_multihead", protocol.call_request(
                        "relay", [keys, args.calls], {}))
                    best = used if best is None or used.cpu_s < best.cpu_s else best
                moved_mib = args.calls * 2 * keys * 64 * 4 / 2**20
                rows.append((keys, moved_mib, best))
            rate = session.framing_rates.get("lab2_multihead")
        finally:
            session.close()
            reference.cleanup()
            submission.cleanup()
    base = rows[0][2].cpu_s or 1e-9
    print(f"{args.calls} calls into lab 1 a measured call, least of {args.repeat}")
    print(f"rate: {rate}")
    print(f"{'keys':>6} {'MiB moved':>10} {'raw CPU-s':>10} {'taken off':>10} "
          f"{'charged':>9} {'vs smallest':>12}")
    for keys, mib, used in rows:
        print(f"{keys:>6} {mib:>10.1f} {used.cpu_s + used.relay_s:>10.3f} "
              f"{used.relay_s:>10.3f} {used.cpu_s:>9.3f} {used.cpu_s / base:>11.1f}x")


if __name__ == "__main__":
    main()
