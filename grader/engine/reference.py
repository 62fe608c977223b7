"""Reference implementations for the suites, loaded in the trusted process only.

Where PyTorch has no built-in (positional encodings), the suites compare against the
instructor's ``solutions/``. Those files import each other by module name (as student files
do), so they are loaded with the solutions folder briefly first on ``sys.path`` and kept
under private names, never as ``lab1_attention`` and friends. Which solutions: the course's
that the pytest session of this process grades against (``use_solutions``: the
``SuiteRunner`` sets its ``Course``'s before every run; the suites call ``load_reference``
by lab alone).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_PREFIX = "grader_reference_"
_cache: dict[tuple[str, str], ModuleType] = {}
_solutions: Path | None = None


def use_solutions(folder: str | Path | None) -> None:
    """Load references from ``folder`` (a course's ``solutions/``) from now on; None: none."""
    global _solutions
    _solutions = Path(folder) if folder is not None else None


def has_reference(lab: str) -> bool:
    """Whether ``lab``'s reference solution can be loaded: never in a student release,
    which holds the public tests' stored answers instead (suites/_snapshot.py)."""
    return _solutions is not None and (_solutions / f"{lab}.py").is_file()


def load_reference(lab: str) -> ModuleType:
    """The solutions module for ``lab`` (e.g. ``"lab3_positional"``)."""
    if _solutions is None:
        raise FileNotFoundError(f"no course solutions to load the reference of {lab} from "
                                "(grader.engine.reference.use_solutions)")
    key = (str(_solutions), lab)
    if key not in _cache:
        path = _solutions / f"{lab}.py"
        if not path.is_file():
            raise FileNotFoundError(f"no reference solution at {path}")
        saved_path = list(sys.path)
        saved_mods = {k: v for k, v in sys.modules.items() if k.startswith("lab")}
        sys.path.insert(0, str(_solutions))
        try:
            spec = importlib.util.spec_from_file_location(_PREFIX + lab, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            sys.path[:] = saved_path
            for name in [k for k in sys.modules if k.startswith("lab") and k not in saved_mods]:
                del sys.modules[name]
        _cache[key] = module
    return _cache[key]
