"""How an answered request counts for availability and error rates, in one place (the SLO
tracker and the automatic canaries' evidence both use it)."""

from __future__ import annotations


def counted(status: int) -> bool:
    """Whether the request counts at all: not when the client gave up on it (499)."""
    return status != 499


def failed(status: int) -> bool:
    """A 5xx, the gateway's own included (no endpoint, queue timeout, upstream failure)."""
    return status >= 500


def succeeded(status: int) -> bool:
    """A 2xx: its latencies count for the latency objectives and gates."""
    return 200 <= status < 300
