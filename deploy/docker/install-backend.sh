#!/bin/sh
# Install kvgate's reference backend (the torch runner: the `backend` extra) into the virtual
# environment $1 from the source tree $2. backend.Dockerfile runs this; so does
# `make check-images`. TORCH names the torch to install (a CPU build by default: set
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu where PyPI would give a CUDA one).
set -eu
. "$(dirname "$0")/fresh-venv.sh"
venv=$1
build=$(copy_of_tree "$2")
new_venv "$venv"
pin="-c $build/constraints.txt"  # the versions the project is tested with
"$venv/bin/pip" install --no-cache-dir --quiet $pin "${TORCH:-torch==2.13.0}"
"$venv/bin/pip" install --no-cache-dir --quiet $pin "$build[backend]"
rm -rf "$build"
(cd / && "$venv/bin/python" -c "import torch, safetensors, backends.runners")
