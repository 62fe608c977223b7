"""The fast loop's guard: a test outside ``-m slow`` may not start a sandbox.

tests/conftest.py names, in TESTS_NO_SANDBOX, the test that runs while it is not marked
slow; an audit hook (in the test process, and through this folder's sitecustomize.py in the
Python processes it starts) refuses to launch a zygote meanwhile, so a test that grades
fails at once and says where its marker is decided. Standard library only: it runs at the
start of every child interpreter.
"""

from __future__ import annotations

import os
import sys

ENV = "TESTS_NO_SANDBOX"
_installed = False


def _refuse(event: str, args: tuple) -> None:
    if event != "subprocess.Popen" or not os.environ.get(ENV):
        return
    argv = args[1] if len(args) > 1 else ()
    argv = [argv] if isinstance(argv, (str, bytes)) else list(argv or ())
    if any(str(a).endswith("zygote.py") for a in argv):
        raise RuntimeError(
            f"{os.environ[ENV]} starts a sandbox (a zygote) but is not marked slow: "
            "list it, its module or its fixture in tests/conftest.py (SLOW_*), so that "
            "pytest -m 'not slow' stays the fast loop")


def install() -> None:
    """Add the audit hook once (audit hooks cannot be removed; it checks ENV at each event)."""
    global _installed
    if not _installed:
        sys.addaudithook(_refuse)
        _installed = True
