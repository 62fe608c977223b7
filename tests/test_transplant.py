"""No lab's given code scores in another lab (#41): grader validate's transplant check.

Lab 8's stub once gave every student ``sinusoidal_table``, lab 3's graded formula; pasted
into lab3_positional.py it earned 9/25 there. Lab 8 now takes lab 3's table by importing lab 3
(the course's reference answers while lab 8 is graded), and ``grader validate`` grades every
lab's stub with each other lab's given code standing in for the student's parts.
"""

from __future__ import annotations

import shutil

import pytest

from grader import paths
from grader.authoring.transplant import TRANSPLANTED, candidates, given_code, student_parts
from grader.authoring.validate import _transplants_that_score
from grader.course import Course
from grader.grading import Grader

LAB_FILES = sorted(p.name for p in (paths.KIT / "exercises").glob("lab*.py"))
# What lab 8's stub gave before #41 (verbatim): lab 3's table.
OLD_LAB8_TABLE = '''

def sinusoidal_table(max_len, d_model):
    """float32 (max_len, d_model): lab 3's table."""
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    inv_freq = torch.pow(10000.0, -torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angles = position * inv_freq
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.to(torch.float32)
'''


def test_the_kits_given_code_is_found_and_stands_in_for_every_student_part():
    given = {(g.lab_file, g.where) for f in LAB_FILES
             for g in given_code(paths.KIT / "exercises" / f)}
    assert given == {("lab8_train_transformer.py", "make_batch"),
                     ("lab8_train_transformer.py", "Seq2SeqTransformer.embed")}
    # No stub gives a lab's table any more; lab 8 imports lab 3's.
    lab8 = (paths.KIT / "exercises" / "lab8_train_transformer.py").read_text()
    assert "def sinusoidal_table" not in lab8
    assert "from lab3_positional import sinusoidal_positional_encoding" in lab8
    found = candidates(paths.KIT / "exercises", LAB_FILES)
    assert len(found) == 2 * (len(LAB_FILES) - 1)
    lab3 = next(text for lab_file, g, text in found if lab_file == "lab3_positional.py"
                and g.where == "make_batch")
    for part in student_parts(paths.KIT / "exercises" / "lab3_positional.py"):
        assert f"\n{part} = {TRANSPLANTED}\n" in lab3 + "\n"
    compile(lab3, "lab3_positional.py", "exec")


@pytest.mark.slow
def test_a_given_table_that_is_another_labs_answer_is_caught(tmp_path):
    """Lab 8's old given table, put back in a course's lab 8 stub: validate names the lab 3
    tests it passes there; the kit's own stubs give nothing."""
    course = tmp_path / "course"
    course.mkdir()
    shutil.copyfile(paths.KIT / "rubric.yaml", course / "rubric.yaml")
    shutil.copytree(paths.KIT / "solutions", course / "solutions")
    (course / "exercises").mkdir()
    for f in ("lab3_positional.py", "lab8_train_transformer.py"):
        shutil.copyfile(paths.KIT / "exercises" / f, course / "exercises" / f)
    with Grader(Course(course)) as grader:
        assert _transplants_that_score(grader, Course(course)) == []
        stub8 = course / "exercises" / "lab8_train_transformer.py"
        stub8.write_text(stub8.read_text() + OLD_LAB8_TABLE)
        problems = _transplants_that_score(grader, Course(course))
    assert problems and all(p.startswith("lab3_positional::") and
                            "passes with lab8_train_transformer.py's given sinusoidal_table"
                            in p for p in problems), problems
    assert any("test_sinusoidal" in p for p in problems), problems
