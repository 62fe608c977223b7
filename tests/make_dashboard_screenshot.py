"""Remake docs/class-dashboard.png: a small class graded by ``grade_batch`` (labs 1 and 2),
its class.html shot in headless Chromium.

    PYTHONPATH=. .venv/bin/python tests/make_dashboard_screenshot.py [OUT.png]

The class: fixture submissions under made-up names (a few classic mistakes, several
students each), a stray file (a submission that cannot be graded), and one grader fault,
recorded as the pool records a grading process that died, then the gradebook rebuilt.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from browser import screenshot  # noqa: E402
from helpers import make_submission  # noqa: E402

CLASS = {   # student -> fixture submission
    "amara": "ok_einsum", "bao": "bug_softmax_dim", "chidi": "ok_manual_softmax",
    "dana": "bug_softmax_dim", "eitan": "bug_no_scale", "fatima": "bug_softmax_dim",
    "goran": "ok_loops_style", "hana": "bug_mask_inverted", "ines": "bug_split_no_transpose",
    "jonas": "bug_softmax_dim", "kofi": "bug_no_scale", "lea": "bug_merge_order",
    "mateo": "ok_einsum",
}
FAULT = "noor"              # graded, then recorded as a grading process that died
LABS = ["lab1_attention", "lab2_multihead"]


def main(png: Path) -> None:
    from grader import paths
    from grader.course import Course
    from grader.batch import grade_batch
    from grader.batch.pool import INTERNAL_ERROR, write_student
    from grader.outputs.gradebook import build_gradebook, failed_result
    from grader.results import Fault
    from grader.rubric import load_rubric

    with tempfile.TemporaryDirectory(prefix="dashboard-shot-") as tmp:
        root, out = Path(tmp) / "class", Path(tmp) / "graded"
        for student, fixture in CLASS.items():
            make_submission(fixture, root / student)
        make_submission("ok_einsum", root / FAULT)
        (root / "zoe-notes.txt").write_text("my lab is in the attached email\n")
        grade_batch(root, out=out, jobs=2, progress=False, labs=LABS, course=Course(paths.KIT))
        scored = load_rubric((paths.KIT / "rubric.yaml")).only(LABS)
        reason = f"{INTERNAL_ERROR}: the grading process died (exit code -9)"
        write_student(out, FAULT, failed_result(FAULT, scored, reason, Fault.GRADER), None)
        students = sorted([*CLASS, FAULT, "zoe-notes.txt"])
        build_gradebook(out=out, students=students, rubric=scored, plots=False)
        screenshot(out / "class.html", png, height=int(sys.argv[2]) if len(sys.argv) > 2 else 1600)
    print(f"wrote {png}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/class-dashboard.png"))
