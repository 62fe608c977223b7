"""How many failing tests of labs 5-8 name a cause (issue #42: at least 9 in 10).

    .venv/bin/python benchmarks/bench_diagnoses.py              # every bug_ fixture of labs 5-8
    .venv/bin/python benchmarks/bench_diagnoses.py --labs lab6_efficient_attention

Grades each fixture submission (tests/fixtures/submissions/bug_*) on the labs it changes, as
``grader grade`` grades it (public and hidden tests), and counts, per lab, the failing tests
and those whose feedback names a cause (a diagnosis). Prints every failing test that names
none, so the next diagnosis to add is the first line of that list.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers import fixture_names, grade, labs_changed, make_submission  # noqa: E402

from grader import paths  # noqa: E402
from grader.course import Course  # noqa: E402
from grader.rubric import load_rubric  # noqa: E402
from grader.sandbox import Zygote  # noqa: E402

LABS = ("lab5_decoder", "lab6_efficient_attention", "lab7_relative_positions",
        "lab8_train_transformer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labs", nargs="*", default=list(LABS))
    args = parser.parse_args()
    rubric = load_rubric(paths.KIT / "rubric.yaml")
    zygote = Zygote(forbidden=rubric.all_forbidden,
                    hide=Course(paths.KIT, rubric).private_paths).start()
    failing, named, unnamed = Counter(), Counter(), []
    try:
        for name in fixture_names("bug_"):
            labs = [lab for lab in labs_changed(name, rubric) if lab in args.labs]
            if not labs:
                continue
            sub = make_submission(name, Path(tempfile.mkdtemp()) / "s")
            result = grade(sub, rubric=rubric, zygote=zygote, labs=labs)
            for lab in result.labs:
                for t in lab.tests:
                    if t.passed or t.deferred:
                        continue
                    failing[lab.name] += 1
                    if t.diagnosis:
                        named[lab.name] += 1
                    else:
                        unnamed.append(f"{name}: {lab.name}::{t.name}: {t.message[:160]}")
    finally:
        zygote.close()
    for lab in args.labs:
        print(f"{lab:28s} {named[lab]:3d} of {failing[lab]:3d} failing tests name a cause")
    total_named, total = sum(named.values()), sum(failing.values())
    print(f"{'labs ' + ', '.join(lab[3] for lab in args.labs):28s} {total_named:3d} of {total:3d}"
          f" ({total_named / max(total, 1):.0%})")
    print("\nfailing tests that name no cause:")
    for line in unnamed:
        print("  " + line)


if __name__ == "__main__":
    main()
