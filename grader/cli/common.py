"""What the command modules share: the rubric the user named (``--rubric``), or the course's,
and ``--lab`` lists. Imports nothing heavy (no torch): ``grader --help`` loads this."""

from __future__ import annotations

import os
import time
from pathlib import Path

_IMPORTED_AT = time.monotonic()     # the fallback start where /proc cannot say


def waited_s() -> float:
    """Seconds since this process started (the kernel's start time, so the interpreter's
    own start and every import count): what a student waited for the command so far.
    Where /proc is not there, since this module was imported."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            # Field 22 (after the parenthesised command, which may hold spaces): the start
            # time in clock ticks since boot.
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        if 0.0 <= uptime - started < 86400.0:
            return uptime - started
    except (OSError, ValueError, IndexError):
        pass
    return time.monotonic() - _IMPORTED_AT


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
