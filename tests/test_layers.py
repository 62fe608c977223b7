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


def _worker_side(tmp_path: Path, worker_text: str) -> Path:
    return _package(tmp_path, {
        "__init__.py": "",
        "sandbox/__init__.py": "",
        "sandbox/zygote.py": "import os\nimport torch\nimport worker\n",
        "sandbox/worker.py": worker_text,
        "sandbox/wire.py": "import json\nimport numpy\n",
        "sandbox/host.py": "from grader import paths\n",     # the host side: not checked here
    })


def test_the_worker_side_is_found_from_the_zygote(layers, tmp_path):
    root = _worker_side(tmp_path, "import wire\n")
    assert sorted(layers.worker_side(root)) == ["wire", "worker", "zygote"]
    assert layers.check_worker_side(root) == []
    # and the real one: what the zygote loads by path
    assert {"zygote", "worker", "protocol", "wire", "jail"} <= set(layers.worker_side())
    assert layers.check_worker_side() == []


def test_a_worker_side_import_of_the_grader_or_a_third_party_package_is_caught(layers, tmp_path):
    root = _worker_side(tmp_path, "import wire\n\ndef f():\n    from grader.rubric import Rubric\n"
                                  "    import yaml\n    from . import wire\n")
    problems = layers.check_worker_side(root)
    assert [p.split(" runs in")[0] for p in problems] == [
        "grader/sandbox/worker.py:4: worker", "grader/sandbox/worker.py:5: worker",
        "grader/sandbox/worker.py:6: worker"]
    assert "imports grader.rubric; the worker side may import only the standard library" \
        in problems[0]
    assert "imports yaml" in problems[1] and "imports .wire" in problems[2]


def test_the_diagnosis_may_not_reach_into_the_suites(layers, tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "suites/_training.py": "from grader.engine.compare import assert_true\n",
        "engine/__init__.py": "",
        "engine/compare.py": "",
        "mistakes/__init__.py": "def f():\n    from grader.suites._training import x\n",
    })
    assert layers.check(root) == ["grader/mistakes/__init__.py:2: grader.mistakes (diagnosis) "
                                  "imports grader.suites._training (suite code), a higher layer"]


def test_no_module_decides_by_a_sandbox_modes_name():
    """A sandbox mode's capabilities are one table (grader.sandbox.jail.MODES): code asks
    it (``mode.namespaces``, ``mode.keeper`` ...), never compares a mode's name."""
    import ast

    names = {"root", "userns", "plain"}
    found = []
    for path in sorted((ROOT / "grader").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                texts = {e.value for s in sides
                         for e in ([s] if not isinstance(s, (ast.Tuple, ast.List, ast.Set))
                                   else s.elts)
                         if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                if texts & names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "mode names compared; use grader.sandbox.jail.MODES: " + ", ".join(found)
