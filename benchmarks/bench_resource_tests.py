"""The resource tests of labs 5 and 6 (issue #26) on the reference and the fixtures: what
each measured call used, each test's time, and whether it passed.

    .venv/bin/python benchmarks/bench_resource_tests.py                # the default set
    .venv/bin/python benchmarks/bench_resource_tests.py ok_lab6_unfold

Each submission is graded as ``grader grade`` grades it (labs 5 and 6 only); every
``student.measure`` call is recorded in the grading process: the test, the length of its
first tensor argument, reference or student, the peak memory charged (MB) and the CPU time
of the call (s). The per-test wall time covers its warm-ups and the reference's runs too.
Say the machine's load (printed) with the figures.
"""

from __future__ import annotations

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
           "bug_generate_recomputes_prefix", "bug_sliding_window_full_matrix"]


def main(names: list[str]) -> None:
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
            sub = ((paths.KIT / "solutions") if name == "solutions"
                   else make_submission(name, Path(tempfile.mkdtemp()) / "s"))
            records.clear()
            result = grade(sub, rubric=rubric, zygote=zygote, labs=list(RESOURCE_TESTS))
            print(f"\n== {name}")
            for lab, tests in RESOURCE_TESTS.items():
                for t in result.lab(lab).tests:
                    if t.name not in tests:
                        continue
                    print(f"  {'pass' if t.passed else 'FAIL'} {t.name}: {t.duration_s:.2f} s")
                    for test, size, ref, used in records:
                        if test == t.name:
                            print(f"      {'reference' if ref else 'student  '} {size}: "
                                  f"{used.peak_bytes / 2**20:7.1f} MB {used.cpu_s:7.3f} s CPU")
    finally:
        zygote.close()


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT)
