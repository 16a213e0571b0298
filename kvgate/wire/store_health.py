"""Whether a shared store (Redis: the limits' buckets, the replicas' picks) is up: it goes down
only after several consecutive failed calls, and comes back only when a call (or a probe)
succeeds.

One failed call is answered by the fallback but does not take the store down: a single slow
turn of a loaded event loop, or one stale pooled connection after a Redis restart, must not
send every request to the fallback for a second. While down, requests do not wait on the store
at all; a background probe finds it again.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("kvgate")

FAILURES_TO_DOWN = 3  # consecutive failed calls that take the store down


class StoreHealth:
    """Counts consecutive failures; ``up`` flips only on the thresholds above."""

    def __init__(self, name: str, failures_to_down: int = FAILURES_TO_DOWN) -> None:
        self.name = name
        self.failures_to_down = max(1, failures_to_down)
        self.up = True
        self.consecutive = 0
        self.failures = 0  # every failed call, for the metrics
        self.down_since = 0.0  # monotonic; 0 while up

    def succeeded(self) -> bool:
        """Record a successful call; True when this brings the store back up."""
        self.consecutive = 0
        if self.up:
            return False
        log.info("%s is back after %.1fs", self.name, time.monotonic() - self.down_since)
        self.up = True
        self.down_since = 0.0
        return True

    def failed(self, reason: str, *, conclusive: bool = False) -> bool:
        """Record a failed call; True when this takes the store down. A ``conclusive`` failure
        (the start-up check) takes it down at once."""
        self.failures += 1
        self.consecutive += 1
        if not self.up or (self.consecutive < self.failures_to_down and not conclusive):
            return False
        log.warning("%s is down after %d failed call(s): %s", self.name, self.consecutive, reason)
        self.up = False
        self.down_since = time.monotonic()
        return True
