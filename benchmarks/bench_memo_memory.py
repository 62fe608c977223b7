"""Memory of one grading process as a class grows: lab 8's value caches (grader.engine.memo).

    .venv/bin/python benchmarks/bench_memo_memory.py                 # 50, 200, 400 students
    .venv/bin/python benchmarks/bench_memo_memory.py --students 20 100

Lab 8's hidden outcome tests check each student's trained weights with the reference model:
per tier (3 tiers, each its own held-out set of 512 sequences) the teacher-forced loss of the
weights before and after training and the exact-reversal fraction after, all three memoized
on their arguments' values. So every student adds 9 cache keys of ~0.95 MB each (the
weights, ~0.68 MB, and the held-out src/tgt). Training 400 models would take hours; the
students here are synthetic distinct weights (the reference model's, shifted per student),
driven through ``grader.engine.memo.memoized`` exactly as the suites call it, with the same
argument shapes. The checks' bodies are stand-ins (a float from the inputs): the reference
forward allocates only while it runs, and what stays is the cache.

Each policy runs in a fresh process (as a batch's pool process: torch, the grader and the
lab 8 reference imported), which reports its resident set (VmRSS, kernel-counted) before
the first student and after each checkpoint, and the bytes its caches hold:

- ``bytes``: the grader's caches now (``memo.CACHE_BYTES`` of keys and values per cache);
- ``entries``: the policy before #28, 512 entries per cache, whatever their size.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIERS = 3                  # test_trained_model_reverses_{half,80_percent,95_percent}_of_heldout
OLD_ENTRIES = 512          # grader.engine.memo.CACHE_SIZE before #28


def _resident_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(policy: str, checkpoints: list[int]) -> None:
    """One grading process: grade ``max(checkpoints)`` synthetic students, print JSON."""
    sys.path.insert(0, str(ROOT))
    import torch

    from grader.engine import memo
    from grader.suites import _training

    torch.set_num_threads(1)               # as a grading process runs its references

    if policy == "entries":
        class EntryBounded(memo.ValueCache):
            """The cache before #28: at most OLD_ENTRIES entries, of any size."""

            def get_or_compute(self, key, compute):
                if key in self.entries:
                    self.entries.move_to_end(key)
                    return self.entries[key][0]
                value = compute()
                self.entries[key] = (value, 0)
                if len(self.entries) > OLD_ENTRIES:
                    self.entries.popitem(last=False)
                return value

        memo.ValueCache = EntryBounded     # memoized() below builds its caches from it

    # Stand-ins with lab 8's signatures, memoized as _training memoizes the real checks.
    @memo.memoized
    def exact_fraction(state_dict, src, tgt):
        return float(src.float().mean())

    @memo.memoized
    def teacher_forced_loss(state_dict, src, tgt):
        return float(tgt.float().mean())

    caches = [exact_fraction.cache, teacher_forced_loss.cache]
    reference = _training.reference().Seq2SeqTransformer().state_dict()
    heldouts = [_training.heldout(torch.Generator().manual_seed(tier)) for tier in range(TIERS)]
    report = {"policy": policy, "before_mb": round(_resident_mb(), 1), "points": []}
    for student in range(1, max(checkpoints) + 1):
        # A student's weights before and after training: distinct from every other's.
        initial = {k: v + student * 1e-4 if v.is_floating_point() else v.clone()
                   for k, v in reference.items()}
        final = {k: v - student * 1e-4 if v.is_floating_point() else v.clone()
                 for k, v in reference.items()}
        for src, tgt in heldouts:
            teacher_forced_loss(initial, src, tgt)
            teacher_forced_loss(final, src, tgt)
            exact_fraction(final, src, tgt)
        if student in checkpoints:
            held = sum(memo.held_bytes(k) + memo.held_bytes(v)
                       for c in caches for k, (v, _) in c.entries.items())
            report["points"].append({"students": student, "rss_mb": round(_resident_mb(), 1),
                                     "cache_mb": round(held / 2**20, 1),
                                     "entries": sum(len(c) for c in caches)})
    report["key_mb"] = round(memo.held_bytes(memo.value_key(((final,) + heldouts[0], {})))
                             / 2**20, 2)
    print(json.dumps(report))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, nargs="+", default=[50, 200, 400])
    parser.add_argument("--child", choices=["bytes", "entries"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    checkpoints = sorted(args.students)
    if args.child:
        child(args.child, checkpoints)
        return 0
    sys.path.insert(0, str(ROOT))
    from grader.engine.memo import CACHE_BYTES

    print(f"lab 8's value caches in one grading process, {TIERS} tiers x 3 checks per student "
          f"(bound now: {CACHE_BYTES / 2**20:g} MiB a cache; before: {OLD_ENTRIES} entries)")
    print(f"{'policy':>22} {'students':>9} {'VmRSS MB':>9} {'growth MB':>10} "
          f"{'cached MB':>10} {'entries':>8}")
    failed = False
    for policy, label in (("entries", f"before: {OLD_ENTRIES} entries"),
                          ("bytes", f"now: {CACHE_BYTES / 2**20:g} MiB a cache")):
        proc = subprocess.run([sys.executable, __file__, "--child", policy, "--students",
                               *map(str, checkpoints)], capture_output=True, text=True,
                              timeout=1800)
        if proc.returncode != 0:
            print(f"{label}: the grading process failed:\n{proc.stderr[-2000:]}")
            failed = True
            continue
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        for point in report["points"]:
            print(f"{label:>22} {point['students']:>9} {point['rss_mb']:>9.1f} "
                  f"{point['rss_mb'] - report['before_mb']:>10.1f} {point['cache_mb']:>10.1f} "
                  f"{point['entries']:>8}")
        print(f"{'':>22} (resident before the first student: {report['before_mb']} MB; "
              f"one key: {report['key_mb']} MB)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
