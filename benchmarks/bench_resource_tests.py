"""The resource tests of labs 5 and 6 (issue #26) on the reference and the fixtures: what
each measured call used, each test's time, and whether it passed.

    .venv/bin/python benchmarks/bench_resource_tests.py                # the default set
    .venv/bin/python benchmarks/bench_resource_tests.py ok_lab6_unfold
    .venv/bin/python benchmarks/bench_resource_tests.py --lab5 solutions   # lab 5's only

Each submission is graded as ``grader grade`` grades it (labs 5 and 6 only); every
``student.measure`` call is recorded in the grading process: the test, the length of its
first tensor argument, reference or student, the peak memory above the inputs (MB), the
memory its warm-up left held (MB; each test forgives part of it: usage.warmup_allowance)
and the CPU time of the call (s). A name may be a folder of lab files, or an attack
fixture (tests/fixtures/attacks/atk_*). The per-test wall time covers its warm-ups and the reference's runs too.
Say the machine's load (printed) with the figures.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from helpers import grade, make_submission  # noqa: E402

from grader import paths  # noqa: E402
from grader.engine import student as student_mod  # noqa: E402
from grader.rubric import load_rubric  # noqa: E402
from grader.sandbox import Zygote  # noqa: E402

RESOURCE_TESTS = {
    "lab5_decoder": ["test_generate_work_per_new_token"],
    "lab6_efficient_attention": ["test_chunked_attention_memory_stays_linear",
                                 "test_chunked_memory_flat_in_the_number_of_keys",
                                 "test_sliding_window_memory_linear_in_length",
                                 "test_linear_attention_work_grows_linearly"],
}
DEFAULT = ["solutions", "ok_lab5_sdpa", "ok_lab6_einsum_streams", "ok_lab6_unfold",
           "ok_lab6_broadcast_shapes", "atk_madvise_below_baseline", "bug_dense_below_threshold",
           "bug_online_softmax_missing", "atk_burn_short_length",
           "bug_generate_recomputes_prefix", "bug_sliding_window_full_matrix",
           "ok_lab6_single_chunk_fast_path", "atk_warmup_scratch_hides_score_block"]
ATTACKS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "attacks"


def _submission(name: str) -> Path:
    """The reference, overlaid with the lab files of fixture (or folder) ``name``."""
    if name == "solutions":
        return paths.KIT / "solutions"
    if not (ATTACKS / name).is_dir() and not Path(name).is_dir():
        return make_submission(name, Path(tempfile.mkdtemp()) / "s")
    sub = Path(tempfile.mkdtemp()) / "s"
    sub.mkdir()
    for f in (paths.KIT / "solutions").glob("lab*.py"):
        shutil.copyfile(f, sub / f.name)
    for f in (ATTACKS / name if (ATTACKS / name).is_dir() else Path(name)).glob("lab*.py"):
        shutil.copyfile(f, sub / f.name)
    return sub


def main(names: list[str]) -> None:
    labs = [lab for lab in RESOURCE_TESTS if f"--{lab[:4]}" in names] or list(RESOURCE_TESTS)
    names = [n for n in names if not n.startswith("--")] or DEFAULT
    print("load:", Path("/proc/loadavg").read_text().strip())
    records = []
    original = student_mod.Session.measure

    def recording(self, lab, req, warmup=None, *, reference=False):
        value, used = original(self, lab, req, warmup, reference=reference)
        first = next((a for a in req.get("args", []) if hasattr(a, "shape")), None)
        size = tuple(first.shape) if first is not None else ()
        records.append((self.test.rsplit("::", 1)[-1], size, reference, used))
        return value, used

    student_mod.Session.measure = recording
    rubric = load_rubric((paths.KIT / "rubric.yaml"))
    zygote = Zygote(forbidden=rubric.all_forbidden).start()
    try:
        for name in names:
            sub = _submission(name)
            records.clear()
            result = grade(sub, rubric=rubric, zygote=zygote, labs=labs)
            print(f"\n== {name}")
            for lab in labs:
                tests = RESOURCE_TESTS[lab]
                for t in result.lab(lab).tests:
                    if t.name not in tests:
                        continue
                    print(f"  {'pass' if t.passed else 'FAIL'} {t.name}: {t.duration_s:.2f} s")
                    for test, size, ref, used in records:
                        if test == t.name:
                            print(f"      {'reference' if ref else 'student  '} {size}: "
                                  f"{used.peak_bytes / 2**20:7.1f} MB (kept "
                                  f"{used.kept_bytes / 2**20:5.1f} MB) {used.cpu_s:7.3f} s CPU")
    finally:
        zygote.close()


if __name__ == "__main__":
    main(sys.argv[1:])
