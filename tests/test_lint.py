"""ruff (rules F, B, SIM: pyproject.toml) is clean over the repository's Python code."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")


@pytest.mark.skipif(RUFF is None, reason="ruff is a dev dependency: pip install -e '.[dev]'")
def test_ruff_finds_nothing():
    proc = subprocess.run([RUFF, "check", "--output-format", "concise", "grader", "tests",
                           "benchmarks", ".ci"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
