#!/bin/sh
# Install kvgate for the gateway and EPP image into the virtual environment $1 from the source
# tree $2, with the request path compiled by mypyc. gateway.Dockerfile runs this; so does
# `make check-images` (in a fresh venv on the CI machine, where images cannot be built).
set -eu
. "$(dirname "$0")/fresh-venv.sh"
venv=$1
build=$(copy_of_tree "$2")
new_venv "$venv"
pin="-c $build/constraints.txt"  # the versions the project is tested with
# the runtime dependencies first: mypyc type-checks the modules against them
"$venv/bin/pip" install --no-cache-dir --quiet $pin "$build"
"$venv/bin/pip" install --no-cache-dir --quiet $pin mypy types-PyYAML types-protobuf \
    types-tqdm 'setuptools>=77' wheel
(cd "$build" && KVGATE_COMPILE=1 "$venv/bin/pip" install --no-cache-dir --quiet \
    --no-build-isolation --no-deps --force-reinstall .)
rm -rf "$build"
"$venv/bin/pip" uninstall --quiet --yes mypy types-PyYAML types-protobuf types-tqdm
(cd / && "$venv/bin/python" -c "from gateway.base.build_info import request_path_compiled as c; assert c(), 'not compiled'")
