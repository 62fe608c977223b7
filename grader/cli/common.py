"""What the command modules share: the course (``--course``, found once here; ``--rubric``),
made into one ``Course`` per command, and ``--lab`` lists. Imports nothing heavy (no torch):
``grader --help`` loads this."""

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


# The one place the environment names the course: ``--course`` wins, then this variable,
# then the kit this grader came from. Read once, by ``resolve_course_dir`` (``main``).
COURSE_ENV = "GRADER_COURSE_DIR"


def resolve_course_dir(option: str | None) -> Path:
    """The course folder: ``--course`` if given, else ``$GRADER_COURSE_DIR``, else the kit."""
    from grader import paths

    return Path(option or os.environ.get(COURSE_ENV) or paths.KIT).expanduser().resolve()


def course_named(args) -> str | None:
    """Where the course of this command was named: ``--course``, ``GRADER_COURSE_DIR``, or
    None (the kit this grader came from)."""
    if getattr(args, "course", None):
        return "--course"
    return COURSE_ENV if os.environ.get(COURSE_ENV) else None


def course_problem(folder: Path, rubric: str | None = None, named: str | None = None) -> str | None:
    """Why ``folder`` is not a course (no such folder; no rubric), or None: one line, the
    ``error:`` every command that reads a course gives instead of comparing, building or
    grading nothing."""
    hint = "(pass --course DIR or set GRADER_COURSE_DIR)"
    if not folder.is_dir():
        return f"{named + ' ' if named else ''}{folder}: no such course folder {hint}"
    if rubric:
        return None if Path(rubric).is_file() else f"{rubric}: rubric file not found"
    if not (folder / "rubric.yaml").is_file():
        return f"no rubric.yaml in {folder} {hint}"
    return None


def course_dir_arg(args) -> Path:
    """The course folder ``main`` resolved (``resolve_course_dir``) for this command;
    ``UsageError`` (one line) when it is no course (``course_problem``)."""
    from grader.errors import UsageError

    folder = getattr(args, "course_dir", None)
    if folder is None:          # a command function called without ``main`` (tests)
        folder = args.course_dir = resolve_course_dir(getattr(args, "course", None))
    problem = course_problem(folder, getattr(args, "rubric", None), course_named(args))
    if problem:
        raise UsageError(problem)
    return folder


def instructor_course_dir(args, command: str, builds: str, note: str = "") -> Path:
    """The course folder of an instructors' ``grader <command>``, which ``builds`` something
    from the solutions: one that holds solutions/; ``UsageError`` (one line, ``note``
    added) in a student kit, which does not."""
    from grader.errors import UsageError

    folder = course_dir_arg(args)
    if not (folder / "solutions").is_dir():
        raise UsageError(f"grader {command} is for instructors: it builds {builds} from "
                         f"solutions/, which {folder} does not have{note}")
    return folder


def course_arg(args):
    """The ``Course`` of this command (``--course``, ``--rubric``), made once: its rubric
    parsed and checked against the suites here (``RubricError`` names file and line), and
    its output mode the mode of every file this process writes from now on."""
    course = getattr(args, "course_obj", None)
    if course is None:
        from grader.course import Course
        from grader.outputs.atomic import use_output_mode

        course = Course(course_dir_arg(args), getattr(args, "rubric", None) or None)
        use_output_mode(course.output_mode)
        args.course_obj = course
    return course


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
