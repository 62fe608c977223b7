"""The layers contract (.ci/layers.py): the grader's imports go one way, with no cycle."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def layers():
    spec = importlib.util.spec_from_file_location("ci_layers", ROOT / ".ci" / "layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "grader"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_grader_package_keeps_its_layers(layers):
    assert layers.check() == []


def test_an_import_inside_a_function_that_goes_up_is_caught(layers, tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "errors.py": "",
        "grading.py": "from grader.errors import *\n",
        # the bottom layer reaching up, late, as grading.py once reached into batch
        "rubric.py": "def f():\n    from grader import grading\n    return grading\n",
    })
    assert layers.check(root) == ["grader/rubric.py:2: grader.rubric (base) imports "
                                  "grader.grading (grading), a higher layer"]


def test_a_cycle_within_one_layer_is_caught(layers, tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "engine/__init__.py": "",
        "engine/a.py": "from . import b\n",
        "engine/b.py": "def g():\n    from grader.engine.a import x\n",
    })
    assert layers.check(root) == ["import cycle: grader.engine.a -> grader.engine.b -> "
                                  "grader.engine.a"]


def test_a_module_in_no_layer_is_refused(layers, tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "stray.py": "import os\n"})
    assert layers.check(root) == ["grader/stray.py: module grader.stray is in no layer of "
                                  ".ci/layers.py; place it in one"]
