"""A correct submission scores full marks wherever the grader's environment lives.

A clone under /tmp with the README's own .venv is a normal newcomer setup. The worker's
private /tmp must not hide the interpreter's packages that live there: a lab that imports
an installed package lazily (or prints a tensor, which makes torch import more of itself)
must grade as it does with the environment elsewhere, in every sandbox mode.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from grader import paths

LAB1 = "lab1_attention"
# Imported only when the student's function runs (after the zygote forked the worker).
LAZY_USE = '''

_reference_sdpa = scaled_dot_product_attention


def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0, training=False):
    import tmpvenv_helper                      # a package installed in the /tmp venv
    print(q[0, 0, :3])                          # a newcomer's debugging print
    return _reference_sdpa(q, k, v, mask=mask, dropout_p=dropout_p,
                           training=training)
'''


@pytest.fixture(scope="module")
def tmp_venv():
    """A venv under /tmp whose own site-packages holds one package; the course's packages
    (torch, the grader) come from a .pth line, as a second site folder would give them."""
    root = Path(tempfile.mkdtemp(prefix="grader-tmpvenv-", dir="/tmp"))
    os.chmod(root, 0o755)
    try:
        venv = root / ".venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                       timeout=120)
        python = venv / "bin" / "python"
        site = Path(subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True).stdout.strip())
        (site / "tmpvenv_helper.py").write_text("VALUE = 1\n")
        (site / "course.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n"
                                         f"{paths.PACKAGE.parent}\n")
        for p in [root, venv, *venv.rglob("*")]:
            if p.is_dir():
                os.chmod(p, 0o755)
        yield python
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("mode", ["root", "userns", "plain"])
def test_a_lab_that_prints_and_imports_lazily_scores_full_marks_from_a_tmp_venv(
        tmp_venv, mode, tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    lab1 = ((paths.KIT / "solutions") / f"{LAB1}.py").read_text() + LAZY_USE
    (sub / f"{LAB1}.py").write_text(lab1)
    out = tmp_path / "out"
    proc = subprocess.run([str(tmp_venv), "-m", "grader.cli", "grade", str(sub), "--out",
                           str(out), "--lab", LAB1],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "GRADER_SANDBOX_MODE": mode,
                               "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    failed = [(t["name"], t["output"]) for t in data["tests"] if t["status"] != "passed"]
    assert failed == [] and data["score"] == data["extra_data"]["labs"][LAB1]["max_score"]
