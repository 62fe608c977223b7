"""``grader init DIR``: a new course folder, copied from this kit, ready for ``grader validate``.

A course folder holds what an instructor edits: ``rubric.yaml``, ``solutions/`` (the
reference, with marked solution regions) and ``exercises/`` (the stubs, made from the
solutions by ``grader stubs``), plus a README and a ``.gitignore`` that keeps the course
secret out of version control. The suites come with the package (``paths.SUITES``): a
course adds no test files. The folder is built aside and renamed into place, so a failed
init leaves nothing half-made.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from grader import paths
from grader.errors import UsageError
from grader.secret import SECRET_FILE

COURSE_FILES = ("rubric.yaml",)
COURSE_FOLDERS = ("solutions", "exercises")

README = """\
# {name}: an attention-labs course

Made by `grader init` from attention-labs {version}. Point the grader at this folder with
`--course {path}` (before the command) or `export GRADER_COURSE_DIR={path}`.

| file | what it is |
|---|---|
| `rubric.yaml` | points, visibility, tolerances, time limits, forbidden APIs of each lab's tests |
| `solutions/` | the reference solutions; the code students write sits between `# BEGIN SOLUTION` and `# END SOLUTION` |
| `exercises/` | the student stubs, generated from `solutions/` (do not edit by hand) |
| `.grader-secret` | made on first use; hidden-test inputs derive from it; never commit it |

The test suites come with the grader package; the rubric names every test of them.

```bash
grader --course {path} validate              # solutions score full marks, stubs 0, rubric == suites
grader --course {path} stubs                 # after editing solutions/: regenerate exercises/
grader --course {path} release --out REL     # what students get (no hidden tests, no solutions)
grader --course {path} batch ROOT --out DIR  # grade a class (--lab LAB: one lab, e.g. one a week)
```
"""


def kit_course(in_use: Path | None = None) -> Path:
    """The course to copy: the course folder in use (``in_use``: the one the command line
    named) if it has a rubric, else the checkout that holds the package. UsageError when
    neither has one (a plain ``pip install`` ships the grader, not the course files)."""
    folders = [Path(in_use)] if in_use is not None else []
    for folder in (*folders, paths.KIT):
        if (folder / "rubric.yaml").is_file() and (folder / "solutions").is_dir():
            return folder
    where = f"neither {folders[0]} nor {paths.KIT} has" if folders else f"{paths.KIT} does not have"
    raise UsageError(f"no course to copy: {where} rubric.yaml and solutions/; pass --from a "
                     "course folder (e.g. a checkout of attention-labs)")


def init_course(dest: str | Path, *, source: str | Path | None = None,
                version: str = "", in_use: Path | None = None) -> Path:
    """Create the course folder ``dest`` (new, or an empty folder) from ``source`` (default:
    ``kit_course(in_use)``); returns it. UsageError if ``dest`` is a file or a non-empty folder."""
    dest = Path(dest).expanduser().resolve()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"{dest}: already exists and is not empty; grader init makes a new "
                         "course folder (choose a new name, or empty it first)")
    src = Path(source).expanduser().resolve() if source else kit_course(in_use)
    missing = [n for n in (*COURSE_FILES, *COURSE_FOLDERS) if not (src / n).exists()]
    if missing:
        raise UsageError(f"{src}: not a course folder (no {', '.join(missing)})")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for name in COURSE_FILES:
            shutil.copyfile(src / name, staging / name)
        for name in COURSE_FOLDERS:
            shutil.copytree(src / name, staging / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
        (staging / "README.md").write_text(
            README.format(name=dest.name, path=dest, version=version or "(unknown version)"),
            encoding="utf-8")
        (staging / ".gitignore").write_text(f"/{SECRET_FILE}\n__pycache__/\n", encoding="utf-8")
        staging.chmod(0o755)
        if dest.exists():
            dest.rmdir()                    # empty: checked above
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest
