"""A route's public model name put back in what its engines answer: a pool may serve a route's
model under another name (``pools.<name>.model``); the client reads the name it asked for, in
both deployments (the gateway, and the picker behind Envoy, as GIE does)."""

from __future__ import annotations

import json
from collections.abc import Callable

Restore = Callable[[bytes], bytes]


def model_restorer(served: str | None, public: str) -> Restore | None:
    """A function that puts ``public`` where a body or complete SSE events name ``served`` as
    their model; None when there is nothing to put back."""
    if not served or not public or served == public:
        return None
    pairs = [
        (f'"model"{sep}{json.dumps(served)}'.encode(), f'"model"{sep}{json.dumps(public)}'.encode())
        for sep in (":", ": ")
    ]

    def restore(data: bytes) -> bytes:
        for old, new in pairs:
            data = data.replace(old, new)
        return data

    return restore
