#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image (Ubuntu): install
# Python and the grader's dependencies into a virtual environment at /autograder/venv.
# See docs/ci-autograding.md for choosing the PyTorch build (CPU wheels keep memory low).
set -euo pipefail

ROOT="${AUTOGRADER_ROOT:-/autograder}"
SOURCE="$ROOT/source"
VENV="$ROOT/venv"

# Written by `grader gradescope`: TORCH_INDEX_URL (optional extra package index for torch).
TORCH_INDEX_URL=""
if [ -f "$SOURCE/setup.env" ]; then
    # shellcheck disable=SC1091
    . "$SOURCE/setup.env"
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends python3 python3-venv python3-pip ca-certificates

python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --no-cache-dir --disable-pip-version-check)

if compgen -G "$SOURCE/wheels/*.whl" > /dev/null; then
    # Wheels shipped in the zip (`grader gradescope --wheels DIR`): no index needed.
    "${PIP[@]}" --no-index --find-links "$SOURCE/wheels" -r "$SOURCE/requirements.txt"
elif [ -n "$TORCH_INDEX_URL" ]; then
    "${PIP[@]}" --extra-index-url "$TORCH_INDEX_URL" -r "$SOURCE/requirements.txt"
else
    "${PIP[@]}" -r "$SOURCE/requirements.txt"
fi

# Fail the image build now, not every submission later, if the grader cannot import.
cd "$SOURCE"
PYTHONPATH="$SOURCE" "$VENV/bin/python" -c \
    "import torch, grader.grading, grader.autograder.gradescope; print('grader ready, torch', torch.__version__)"
