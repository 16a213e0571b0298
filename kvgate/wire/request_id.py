"""Request ids: a random per-process prefix and a counter (unique, with no syscall per id)."""

from __future__ import annotations

import itertools
import os

_PREFIX = os.urandom(8).hex()
# From 2**60 up, hex() gives 16 digits without padding (for the next 2**63 ids).
_COUNTER = itertools.count(2**60 + int.from_bytes(os.urandom(4)))


def new_request_id() -> str:
    """32 hex characters, unique within this process and, by the random prefix, across them."""
    return _PREFIX + hex(next(_COUNTER))[2:]
