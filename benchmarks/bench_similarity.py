"""The similarity report (#30), measured: does it find every planted copy and flag no honest
student, and how does its cost grow with the class?

    PYTHONPATH=. .venv/bin/python benchmarks/bench_similarity.py [--sizes 250,500,1000]

1. A synthetic class of 200 students x 8 labs. Honest: the reference solution and the
   independently written ``ok_*`` fixtures (each lab's own file). Planted: a copy of every
   honest source in every kind of tests/copying.py (verbatim, renamed, reordered functions,
   new comments, reformatted, moved statements, dead code, all of them at once). The other
   students hand in the stub. Printed: the lowest planted and highest honest pair score per
   lab, the honest pairs flagged at the default threshold, and each student against the
   course's solutions (the copies of the reference are copies of the solution).
2. Classes of 250, 500 and 1,000 students x 8 labs: each student's lab is a variant of an
   honest source (all the transforms, a random seed each) plus a function of their own, so
   the index holds distinct fingerprints per student, as a real class does. Printed: the
   seconds per size and the ratios (n log n would be x2.2 per doubling), with the load.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from copying import KINDS, everything  # noqa: E402
from grader import paths  # noqa: E402
from grader.authoring.stubs import strip_solutions  # noqa: E402
from grader.batch.integrity import SOLUTIONS, THRESHOLD, lab_report, lab_reports  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "submissions"


def derived(fixture: Path) -> bool:
    """Whether an ok_ fixture was written by editing another source (its expect.yaml says
    ``derived_from``), not independently: not an honest student here (a pair of them is a
    copy, and the report rightly flags it: lab 6 0.81, lab 8 0.93-0.97)."""
    return bool((yaml.safe_load((fixture / "expect.yaml").read_text()) or {}).get("derived_from"))


def course() -> dict[str, dict]:
    """lab -> {solution, stub, honest: {origin: source}}."""
    labs = {}
    for path in sorted((paths.KIT / "solutions").glob("lab*.py")):
        solution = path.read_text(encoding="utf-8")
        honest = {"ref": solution}
        for fixture in sorted(FIXTURES.glob("ok_*")):
            if (fixture / path.name).is_file() and not derived(fixture):
                honest[fixture.name] = (fixture / path.name).read_text(encoding="utf-8")
        labs[path.stem] = {"solution": solution, "honest": honest,
                           "stub": strip_solutions(solution, path=str(path))}
    return labs


def quality(labs: dict, size: int = 200) -> bool:
    print(f"1. A class of {size} students, {len(labs)} labs (threshold {THRESHOLD}):")
    ok = True
    rng = random.Random(30)
    for li, (lab, info) in enumerate(labs.items()):
        coded = []                               # (origin, kind, source)
        for origin, source in info["honest"].items():
            coded.append((origin, "honest", source))
            coded += [(origin, kind, f(source, rng)) for kind, f in KINDS.items()]
        assert len(coded) <= size
        students, origin_of = {}, {}
        for i in range(size):
            name = f"s{(i + 23 * li) % size:03d}"
            if i < len(coded):
                origin, kind, source = coded[i]
                students[name], origin_of[name] = source, (origin, kind)
            else:
                students[name] = info["stub"]
        started = time.perf_counter()
        entry = lab_report(lab, students, {SOLUTIONS: info["solution"]}, stub=info["stub"],
                           vocabulary_from=[info["solution"], info["stub"]])
        seconds = time.perf_counter() - started
        planted, honest = [], []
        for p in entry["pairs"]:
            a, b = origin_of.get(p["a"]), origin_of.get(p["b"])
            if a is None or b is None:
                honest.append(p)                 # a stub in a pair: nothing may be shared
            elif a[0] == b[0]:
                planted.append(p)
            else:
                honest.append(p)
        n_planted = sum(1 for i, x in enumerate(coded) for y in coded[i + 1:] if x[0] == y[0])
        if os.environ.get("SHOW_HONEST"):
            for p in sorted(honest, key=lambda p: -p["similarity"])[:2]:
                print("     ", origin_of.get(p["a"]), origin_of.get(p["b"]), p["similarity"])
        low = min((p["similarity"] for p in planted), default=0.0)
        high = max((p["similarity"] for p in honest), default=0.0)
        flagged = sum(p["flagged"] for p in honest)
        copies = [r["similarity"] for r in entry["against"]
                  if origin_of.get(r["student"], ("",))[0] == "ref"]
        others = [r["similarity"] for r in entry["against"]
                  if origin_of.get(r["student"], ("ref",))[0] != "ref"]
        good = (len(planted) == n_planted and low > high and flagged == 0
                and min(copies) >= THRESHOLD and max(others, default=0) < THRESHOLD)
        ok &= good
        copies_flagged = sum(p["flagged"] for p in planted
                             if "honest" in (origin_of[p["a"]][1], origin_of[p["b"]][1]))
        n_copies = len(KINDS) * len(info["honest"])
        print(f"   {lab:26s} planted pairs {len(planted):3d}/{n_planted:3d} lowest "
              f"{low:.2f} | honest pairs {len(honest):3d} highest {high:.2f}, flagged "
              f"{flagged} | copies flagged vs their original {copies_flagged}/{n_copies}"
              f" | vs solutions: copies lowest {min(copies):.2f}, others highest "
              f"{max(others, default=0):.2f}"
              + f" | {seconds:.2f} s {'ok' if good else 'FAIL'}")
    return ok


def copydetect_quality(labs: dict) -> None:
    """The same planted class through the copydetect package (if installed): its own
    tokenizer, winnowing (its defaults: noise 25, guarantee 30 tokens) and boilerplate
    filter (the stub's fingerprints), every pair of files compared (it has no index)."""
    try:
        import io

        import numpy as np
        from copydetect import CodeFingerprint, compare_files
    except ImportError:
        print("3. copydetect is not installed: pip install copydetect to compare")
        return
    print("3. copydetect 0.5 on the same planted copies (all pairs; max of both directions):")
    rng = random.Random(30)
    for lab, info in labs.items():
        def fp(code, boiler=None):
            return CodeFingerprint("x.py", 25, 6, boilerplate=boiler, fp=io.StringIO(code),
                                   language="python")
        boiler = fp(info["stub"]).hashes
        coded = []
        for origin, source in info["honest"].items():
            coded.append((origin, source))
            coded += [(origin, f(source, rng)) for f in KINDS.values()]
        coded += [("stub", info["stub"])] * 4
        started = time.perf_counter()
        prints = [fp(src, np.array(list(boiler))) for _, src in coded]
        planted, honest = [], []
        for i in range(len(coded)):
            for j in range(i + 1, len(coded)):
                _, sims, _ = compare_files(prints[i], prints[j])
                score = max(sims)
                same = coded[i][0] == coded[j][0] and coded[i][0] != "stub"
                (planted if same else honest).append(score)
        seconds = time.perf_counter() - started
        print(f"   {lab:26s} planted lowest {min(planted):.2f} | honest highest "
              f"{max(honest):.2f} | {len(coded)} files, {seconds:.2f} s "
              f"{'ok' if min(planted) > max(honest) else 'OVERLAP'}")


def _expression(rng: random.Random, depth: int) -> str:
    """A random expression: its syntax tree's shape is what the fingerprints see."""
    if depth == 0 or rng.random() < 0.2:
        return rng.choice(["x", "y", "acc", f"({rng.randrange(9)})", "x.sum()", "y[0]"])
    a, b = _expression(rng, depth - 1), _expression(rng, depth - 1)
    shape = rng.randrange(8)
    if shape == 0:
        return f"({a} {rng.choice(['+', '-', '*', '/', '//', '%', '**', '@'])} {b})"
    if shape == 1:
        return f"{rng.choice(['abs', 'min', 'max', 'round', 'sum', 'len', 'sorted', 'pow'])}({a}, {b})"
    if shape == 2:
        return f"({a} if {b} {rng.choice(['<', '>', '==', '!=', '<=', '>='])} 0 else {b})"
    if shape == 3:
        return f"{a}[{b}:{rng.randrange(9)}]"
    if shape == 4:
        return f"({rng.choice(['-', 'not ', '~'])}{a})"
    if shape == 5:
        return f"[{a} for _ in range({b})]"
    if shape == 6:
        return f"({a} {rng.choice(['and', 'or'])} {b})"
    return f"{a}.{rng.choice(['view', 'reshape', 'transpose', 'mean', 'clamp'])}({b})"


def unique_function(rng: random.Random, i: int) -> str:
    """A helper only this student wrote: a few statements of random shape."""
    body = [f"    acc = {_expression(rng, 3)}" for _ in range(rng.randrange(4, 9))]
    return "\n".join([f"\n\ndef helper_{i}(x, y):", "    acc = x", *body, "    return acc\n"])


def scale(labs: dict, sizes: list[int], jobs: int) -> list[float]:
    print(f"2. Cost by class size ({len(labs)} labs; load {Path('/proc/loadavg').read_text().split()[:3]}, "
          f"{os.cpu_count()} CPUs):")
    rng = random.Random(1)
    variants = {lab: [everything(src, random.Random(s)) for s in range(6)
                      for src in info["honest"].values()] for lab, info in labs.items()}
    times = []
    for n in sizes:
        classes = {lab: {f"s{i:04d}": rng.choice(variants[lab]) + unique_function(rng, i)
                         for i in range(n)} for lab in labs}
        work = [(lab, classes[lab], {SOLUTIONS: info["solution"]}, info["stub"],
                 [info["solution"], info["stub"]], THRESHOLD) for lab, info in labs.items()]
        started, cpu = time.perf_counter(), time.process_time()
        entries = lab_reports(work, jobs=jobs)
        pairs = sum(len(e["pairs"]) for e in entries)
        times.append(time.perf_counter() - started)
        cpu = time.process_time() - cpu
        print(f"   {n:5d} students x {len(labs)} labs: {times[-1]:6.1f} s wall, {jobs} process(es)"
              f"{'' if jobs > 1 else f', {cpu:.1f} s CPU'}; load "
              f"{Path('/proc/loadavg').read_text().split()[0]} ({pairs} pairs kept)")
    for (n0, t0), (n1, t1) in zip(zip(sizes, times, strict=True), zip(sizes[1:], times[1:], strict=True),
                                  strict=False):
        nlogn = (n1 * math.log(n1)) / (n0 * math.log(n0))
        print(f"   {n0} -> {n1}: x{t1 / t0:.2f} (linear x{n1 / n0:.2f}, n log n x{nlogn:.2f})")
    return times


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="250,500,1000")
    parser.add_argument("--class-size", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="processes for the labs (the batch uses one per CPU)")
    parser.add_argument("--copydetect", action="store_true",
                        help="also run the planted class through the copydetect package")
    args = parser.parse_args()
    labs = course()
    ok = quality(labs, args.class_size)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.copydetect:
        copydetect_quality(labs)
    times = scale(labs, sizes, args.jobs) if sizes else []
    if times and sizes[-1] >= 1000:
        ok &= times[-1] < 60
        print(f"   1000 students x 8 labs under 60 s: {'yes' if times[-1] < 60 else 'NO'}")
    print("all figures hold" if ok else "SOME FIGURES DO NOT HOLD")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
