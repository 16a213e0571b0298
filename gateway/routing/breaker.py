"""Per-endpoint circuit breaker: closed → open → half-open → closed.

Closed: requests flow; the breaker opens after ``consecutive_failures`` failures in a row, or
when at least ``min_requests`` outcomes in the last ``window`` seconds include a
``failure_ratio`` share of failures. Open: the endpoint is skipped for ``cool_down`` seconds.
Half-open: up to ``half_open_probes`` requests are let through; if they all succeed the breaker
closes, and any failure opens it again. A failure is a connect error, a timeout, a 5xx or a
stream that broke; a 4xx is the client's doing and counts as a success.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from enum import Enum

from policies.schema import Breakers


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


# The states as module constants: reading an attribute of an Enum class goes through the enum
# metaclass's __getattr__ hook (Python 3.11), and a breaker is consulted several times per request.
CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


class _Slice:
    """Outcomes counted from ``start`` for a slice of the breaker's window."""

    __slots__ = ("failures", "start", "total")

    def __init__(self, start: float) -> None:
        self.start = start
        self.total = 0
        self.failures = 0


class CircuitBreaker:
    """One endpoint's breaker: closed, open for a cool-down, then half-open for a few probes."""

    def __init__(
        self,
        config: Breakers,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[BreakerState], None] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.on_change = on_change
        self._state = CLOSED
        self.closed = True  # the state is CLOSED (read per request without a call)
        self._opened_at = 0.0
        self._consecutive = 0
        self._slices: deque[_Slice] = deque()  # outcomes in the window, in slices of window/20
        self._width = config.window / 20
        self._total = 0
        self._failures = 0
        self._probes = 0  # half-open requests let through
        self._probe_successes = 0

    @property
    def state(self) -> BreakerState:
        if self._state is OPEN and self.clock() >= self._opened_at + self.config.cool_down:
            self._move(HALF_OPEN)
        return self._state

    def available(self) -> bool:
        """May the picker choose this endpoint now? (No side effects.)"""
        if self._state is CLOSED:  # the common case, without reading the clock
            return True
        state = self.state
        return state is CLOSED or (
            state is HALF_OPEN and self._probes < self.config.half_open_probes
        )

    def on_dispatch(self) -> None:
        """A request was sent; half-open, it uses up one probe."""
        if self._state is not CLOSED and self.state is HALF_OPEN:
            self._probes += 1

    def release_probe(self) -> None:
        """A half-open probe ended with no verdict (cancelled, or the request's own fault):
        its slot is free again."""
        if self._probes > 0 and self._state is not CLOSED:
            self._probes -= 1

    def record(self, ok: bool) -> None:
        now = self.clock()
        state = self._state if self._state is CLOSED else self.state
        if state is HALF_OPEN:
            if not ok:
                self._open(now)
                return
            self._probe_successes += 1
            if self._probe_successes >= self.config.half_open_probes:
                self._move(CLOSED)
            return
        if state is OPEN:
            return  # a late answer from before the breaker opened
        self._count(now, ok)
        self._consecutive = 0 if ok else self._consecutive + 1
        if self._consecutive >= self.config.consecutive_failures or (
            self._failures and self._ratio_tripped()
        ):
            self._open(now)

    def _count(self, now: float, ok: bool) -> None:
        """Add an outcome; drop slices older than the window (O(1) amortized)."""
        width = self._width
        slices = self._slices
        if not slices or now >= slices[-1].start + width:
            slices.append(_Slice(now))
        last = slices[-1]
        last.total += 1
        self._total += 1
        if not ok:
            last.failures += 1
            self._failures += 1
        horizon = now - self.config.window
        while slices[0].start + width <= horizon:
            gone = slices.popleft()
            self._total -= gone.total
            self._failures -= gone.failures

    def _ratio_tripped(self) -> bool:
        if self._total < self.config.min_requests:
            return False
        return self._failures / self._total >= self.config.failure_ratio

    def _open(self, now: float) -> None:
        self._opened_at = now
        self._move(OPEN)

    def _move(self, state: BreakerState) -> None:
        if state is self._state:
            return
        self._state = state
        self.closed = state is CLOSED
        self._probes = self._probe_successes = 0
        if state is CLOSED:
            self._consecutive = 0
            self._slices.clear()
            self._total = self._failures = 0
        if self.on_change is not None:
            self.on_change(state)


class RetryBudget:
    """Retries may add at most ``ratio`` of the requests, plus ``min_per_second`` always.

    Each request deposits ``ratio`` of a retry; the balance also refills at ``min_per_second``;
    a retry spends one. The balance is capped, so a quiet period does not bank a retry storm.
    """

    def __init__(
        self, ratio: float, min_per_second: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ratio = ratio
        self.min_per_second = min_per_second
        self.clock = clock
        self.cap = max(10.0, min_per_second * 10)
        self._balance = self.cap
        self._last = clock()

    def deposit(self) -> None:
        now = self.clock()
        balance = self._balance + (now - self._last) * self.min_per_second + self.ratio
        self._balance = balance if balance < self.cap else self.cap
        self._last = now

    def refund(self) -> None:
        """Give back a retry that turned out to be the request's fault, not an endpoint's."""
        self._balance = min(self.cap, self._balance + 1.0)

    def try_spend(self) -> bool:
        self._refill()
        if self._balance >= 1.0:
            self._balance -= 1.0
            return True
        return False

    def _refill(self) -> None:
        now = self.clock()
        self._balance = min(self.cap, self._balance + (now - self._last) * self.min_per_second)
        self._last = now
