"""What the command modules share: the rubric the user named (``--rubric``), or the course's."""

from __future__ import annotations

from pathlib import Path

from grader import paths
from grader.rubric import Rubric, load_rubric


def rubric_path_arg(args) -> Path:
    """``--rubric`` if given, else the course's rubric.yaml."""
    return Path(args.rubric) if getattr(args, "rubric", None) else paths.RUBRIC


def load_rubric_arg(args) -> Rubric:
    """The rubric of ``rubric_path_arg``, loaded (RubricError names file and line)."""
    return load_rubric(rubric_path_arg(args))
