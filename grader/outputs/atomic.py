"""The one atomic writer: a temporary file in the target's folder, fsync'd, then renamed.

A grader killed at any moment leaves the old file or the new one, never half a file
(docs/DESIGN.md, "One result model"). Temporary files are named ``.<name>.<random>`` so that a
resumed batch can sweep the leftovers of a killed write.

A written file gets the permissions any program's new file gets (0666 less the umask:
usually 0644, or 0640), so a teaching assistant's group can read a batch's results, not
the 0600 of the temporary file; ``use_output_mode("private")`` (a rubric's
``output_mode: private``) makes every later file 0600.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


PRIVATE_MODE = 0o600
_private = False


def use_output_mode(mode: str) -> None:
    """``"private"``: files written from now on are 0600; ``"group"`` (default): 0666 less
    the umask. Set once per process by its entry, from its ``Course``'s output mode (the
    command line, a batch and each of its grading processes, the Gradescope runner); a
    Grader sets nothing."""
    global _private
    if mode not in ("group", "private"):
        raise ValueError(f"output mode must be 'group' or 'private', not {mode!r}")
    _private = mode == "private"


def _umask() -> int:
    """The process's umask, read without changing it (os.umask would, for every thread)."""
    with contextlib.suppress(OSError, ValueError), \
            open("/proc/self/status", encoding="ascii", errors="replace") as fh:
        for line in fh:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def default_file_mode() -> int:
    """What a new output file's permissions are: see the module docstring."""
    return PRIVATE_MODE if _private else 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", *, file_mode: int | None = None, **kwargs):
    """A handle on a temporary file next to ``path``, renamed over ``path`` on success.

    ``file_mode``: permission bits of the new file (default: ``default_file_mode()``).
    ``kwargs`` go to ``open`` (encoding, newline...).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, default_file_mode() if file_mode is None else file_mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str, *, file_mode: int | None = None,
                      newline: str | None = None) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_open(path, "w", file_mode=file_mode, encoding="utf-8", newline=newline) as fh:
        fh.write(text)


def atomic_write_bytes(path: str | Path, data: bytes, *, file_mode: int | None = None) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_open(path, "wb", file_mode=file_mode) as fh:
        fh.write(data)
