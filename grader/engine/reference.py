"""Reference implementations for the suites, loaded in the trusted process only.

Where PyTorch has no built-in (positional encodings), the suites compare against the
instructor's ``solutions/``. Those files import each other by module name (as student files
do), so they are loaded with the solutions folder briefly first on ``sys.path`` and kept
under private names, never as ``lab1_attention`` and friends.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from grader import paths

_PREFIX = "grader_reference_"
_cache: dict[str, ModuleType] = {}


def load_reference(lab: str) -> ModuleType:
    """The solutions module for ``lab`` (e.g. ``"lab3_positional"``)."""
    if lab not in _cache:
        path = paths.SOLUTIONS / f"{lab}.py"
        if not path.is_file():
            raise FileNotFoundError(f"no reference solution at {path}")
        saved_path = list(sys.path)
        saved_mods = {k: v for k, v in sys.modules.items() if k.startswith("lab")}
        sys.path.insert(0, str(paths.SOLUTIONS))
        try:
            spec = importlib.util.spec_from_file_location(_PREFIX + lab, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            sys.path[:] = saved_path
            for name in [k for k in sys.modules if k.startswith("lab") and k not in saved_mods]:
                del sys.modules[name]
        _cache[lab] = module
    return _cache[lab]
