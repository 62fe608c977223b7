"""Remake docs/class-similarity.png: the similarity section of class.html, shot in headless
Chromium.

    PYTHONPATH=. .venv/bin/python tests/make_similarity_screenshot.py [OUT.png]

The class: the dashboard test's synthetic students, who hand in the stubs of labs 1 and 2 but
three honest students (independently written fixtures), ana (s01's lab 1, renamed, reordered,
reformatted, with dead code) and bo (the course's lab 2 solution with dead code); the report built by
``grader.batch.integrity.class_report`` as a batch builds it (no grading needed for it).
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from browser import screenshot  # noqa: E402
from copying import add_dead_code, everything  # noqa: E402
from helpers import make_submission  # noqa: E402

LABS = ["lab1_attention", "lab2_multihead"]


def main(png: Path) -> None:
    from grader import paths
    from grader.course import Course
    from grader.batch.integrity import class_report
    from grader.batch.students import list_students
    from grader.outputs.class_page import ClassView, class_page_html
    from grader.outputs.atomic import atomic_write_text
    from grader.rubric import load_rubric
    from test_dashboard import thirteen_and_two_apart, view_of

    rubric = load_rubric((paths.KIT / "rubric.yaml"))
    fixtures = Path(__file__).parent / "fixtures" / "submissions"
    with tempfile.TemporaryDirectory(prefix="similarity-shot-") as tmp:
        root = Path(tmp) / "class"
        view = view_of(thirteen_and_two_apart())
        for record in view.students:           # everyone hands in the stubs of labs 1-2 ...
            folder = make_submission("ok_einsum", root / record.student)
            for lab in LABS:
                (folder / f"{lab}.py").write_text(((paths.KIT / "exercises") / f"{lab}.py").read_text())

        def hand_in(student, lab, text):
            (root / student / f"{lab}.py").write_text(text)

        def fixture(name, lab):
            return (fixtures / name / f"{lab}.py").read_text()
        # ... but these, each written independently,
        hand_in("s00", LABS[0], fixture("ok_einsum", LABS[0]))
        hand_in("s01", LABS[0], fixture("ok_loops_style", LABS[0]))
        hand_in("s02", LABS[0], fixture("ok_manual_softmax", LABS[0]))
        hand_in("s00", LABS[1], fixture("ok_einsum", LABS[1]))
        hand_in("s01", LABS[1], fixture("ok_loops_style", LABS[1]))
        hand_in("s02", LABS[1], fixture("ok_lab2_standalone", LABS[1]))
        rng = random.Random(30)
        # ana copies s01's lab 1 (renamed, reordered, reformatted ...); bo the solution's lab 2
        hand_in("ana", LABS[0], everything(fixture("ok_loops_style", LABS[0]), rng))
        hand_in("bo", LABS[1], add_dead_code(((paths.KIT / "solutions") / f"{LABS[1]}.py").read_text(), rng))
        report = class_report(list_students(root), Course(paths.KIT, rubric), LABS)
        page = Path(tmp) / "class.html"
        shown = ClassView(view.labs, view.students, view.max_total, view.score,
                          similarity=report)
        # The real page, with every section but the heading, the notice and the similarity
        # report hidden (for the shot only), so the shot shows that section.
        only = ("<style>body > section:not(#similarity), #overview, footer "
                "{ display: none; }</style></head>")
        atomic_write_text(page, class_page_html(shown).replace("</head>", only, 1))
        screenshot(page, png, height=int(sys.argv[2]) if len(sys.argv) > 2 else 1500)
    print(f"wrote {png}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/class-similarity.png"))
