"""What the command modules share: the rubric the user named (``--rubric``), or the course's,
and ``--lab`` lists. Imports nothing heavy (no torch): ``grader --help`` loads this."""

from __future__ import annotations

from pathlib import Path


def rubric_path_arg(args) -> Path:
    """``--rubric`` if given, else the course's rubric.yaml (read now: ``--course`` counts)."""
    from grader import paths

    return Path(args.rubric) if getattr(args, "rubric", None) else paths.RUBRIC


def load_rubric_arg(args):
    """The rubric of ``rubric_path_arg``, loaded (RubricError names file and line)."""
    from grader.rubric import load_rubric

    return load_rubric(rubric_path_arg(args))


def labs_arg(values: list[str] | str | None) -> list[str]:
    """``--lab`` values (repeated, or comma-separated) as one list, in order, no repeats."""
    if isinstance(values, str):
        values = [values]
    labs: list[str] = []
    for value in values or []:
        for lab in value.split(","):
            lab = lab.strip()
            if lab and lab not in labs:
                labs.append(lab)
    return labs


def grade_submission(*args, **kwargs):
    """``grader.grading.grade_submission``, imported on the first call (no torch for
    ``--help``); the command modules call it by this module-level name."""
    from grader.grading import grade_submission as grade

    return grade(*args, **kwargs)
