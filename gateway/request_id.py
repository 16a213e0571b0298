"""Request ids: a random per-process prefix and a counter (unique, with no syscall per id)."""

from __future__ import annotations

import itertools
import os

_PREFIX = os.urandom(8).hex()
_COUNTER = itertools.count(int.from_bytes(os.urandom(4)))


def new_request_id() -> str:
    """32 hex characters, unique within this process and, by the random prefix, across them."""
    return f"{_PREFIX}{next(_COUNTER):016x}"  # starts under 2**32: stays 16 digits
