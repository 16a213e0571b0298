"""Optional compiled build of the gateway's request path.

``pip install .`` (and the editable install ``make`` does) builds plain Python.
``KVGATE_COMPILE=1 pip install --no-build-isolation .`` (with mypy installed) compiles the
modules listed under ``[tool.kvgate] compiled_modules`` in pyproject.toml to C extensions with
mypyc: the same code, type-checked by mypy --strict, about a third less CPU per proxied request
(docs/benchmarks.md). ``make compiled`` builds such a copy of the tree in ``build/compiled``
for the benchmarks and ``make test-compiled``. Everything else lives in pyproject.toml.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from setuptools import setup


def compiled_modules() -> list[str]:
    with open(Path(__file__).parent / "pyproject.toml", "rb") as f:
        modules: list[str] = tomllib.load(f)["tool"]["kvgate"]["compiled_modules"]
    return modules


def extensions() -> list[Any]:
    if os.environ.get("KVGATE_COMPILE") != "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        raise SystemExit(
            "KVGATE_COMPILE=1 needs mypy (mypyc) in the build environment: "
            "pip install 'mypy>=1.10' then pip install --no-build-isolation ."
        ) from exc
    return list(mypycify(compiled_modules(), opt_level="3"))


setup(ext_modules=extensions())
