"""How this process's request path was built: compiled with mypyc (setup.py, ``make
compiled``) or plain Python. Logged at start and exported as ``kvgate_build_info``."""

from __future__ import annotations

from importlib import metadata

import kvgate.wire.http.server


def request_path_compiled() -> bool:
    """Whether the request path's modules are C extensions built by mypyc."""
    return not (kvgate.wire.http.server.__file__ or "").endswith(".py")


def version() -> str:
    try:
        return metadata.version("kvgate")
    except metadata.PackageNotFoundError:
        return "unknown"
