"""New prompt content the picker placed on each endpoint lately: the uncached prompt tokens of
its dispatches, decayed with a half-life. Unlike what a cache holds, which stops growing once
the cache is full, it keeps counting where new prefixes (new conversations, new system prompts)
went, and so where their later requests will go."""

from __future__ import annotations

import math
import time

from epp.framework import Endpoint

HALF_LIFE = 60.0  # seconds
_RATE = math.log(2) / HALF_LIFE


def add_placed(endpoint: Endpoint, tokens: int, now: float | None = None) -> None:
    """``tokens`` uncached prompt tokens were just sent to ``endpoint``."""
    now = time.monotonic() if now is None else now
    endpoint.placed_tokens = placed(endpoint, now) + tokens
    endpoint.placed_at = now


def placed(endpoint: Endpoint, now: float | None = None) -> float:
    """The decayed sum of the uncached prompt tokens sent to ``endpoint``."""
    if not endpoint.placed_tokens:
        return 0.0
    now = time.monotonic() if now is None else now
    return endpoint.placed_tokens * math.exp(-_RATE * max(0.0, now - endpoint.placed_at))
