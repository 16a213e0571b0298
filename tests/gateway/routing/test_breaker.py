"""Circuit breaker state machine (tables) and the retry budget."""

from __future__ import annotations

import pytest

from gateway.routing.breaker import BreakerState, CircuitBreaker, RetryBudget
from policies.schema import Breakers

CFG = Breakers(
    consecutive_failures=3,
    failure_ratio=0.5,
    window=10,
    min_requests=6,
    cool_down=5,
    half_open_probes=2,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(events: str, clock: Clock | None = None) -> tuple[CircuitBreaker, list[BreakerState]]:
    """``events``: s = success, f = failure, w = wait past the cool-down, d = dispatch."""
    clock = clock or Clock()
    changes: list[BreakerState] = []
    breaker = CircuitBreaker(CFG, clock, changes.append)
    for event in events:
        if event == "w":
            clock.now += CFG.cool_down + 0.1
        elif event == "d":
            breaker.on_dispatch()
        else:
            breaker.record(ok=event == "s")
    return breaker, changes


@pytest.mark.parametrize(
    ("events", "state", "available"),
    [
        ("", BreakerState.CLOSED, True),
        ("ff", BreakerState.CLOSED, True),
        ("fff", BreakerState.OPEN, False),
        ("ffsff", BreakerState.CLOSED, True),  # a success resets the run
        ("sfsfsf", BreakerState.OPEN, False),  # 3 of 6 failed: the ratio trips
        ("sfsfs", BreakerState.CLOSED, True),  # too few outcomes for the ratio
        ("fffw", BreakerState.HALF_OPEN, True),
        ("fffwdd", BreakerState.HALF_OPEN, False),  # both probes in flight
        ("fffwdsds", BreakerState.CLOSED, True),  # both probes succeeded
        ("fffwdf", BreakerState.OPEN, False),  # a probe failed: open again
        ("fffwdfw", BreakerState.HALF_OPEN, True),
    ],
)
def test_state_machine(events: str, state: BreakerState, available: bool) -> None:
    breaker, _ = run(events)
    assert breaker.state is state
    assert breaker.available() is available


def test_transitions_are_reported_once_each() -> None:
    _, changes = run("fffwdsds")
    assert changes == [BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED]


def test_old_outcomes_leave_the_window() -> None:
    clock = Clock()
    breaker = CircuitBreaker(CFG, clock)
    for ok in (False, True, False, True, False):
        breaker.record(ok)
    clock.now = 20  # the window is 10 s: those are forgotten
    breaker.record(ok=False)
    assert breaker.state is BreakerState.CLOSED


def test_flapping_endpoint_is_isolated_and_readmitted() -> None:
    breaker, changes = run("fffw" + "dsds" + "fff" + "w" + "dsds")
    assert breaker.state is BreakerState.CLOSED
    assert changes.count(BreakerState.OPEN) == 2 and changes[-1] is BreakerState.CLOSED


def test_retry_budget_bounds_extra_load() -> None:
    clock = Clock()
    budget = RetryBudget(ratio=0.2, min_per_second=0.0, clock=clock)
    spent = sum(budget.try_spend() for _ in range(100))  # the initial balance
    assert spent == 10
    granted = 0
    for _ in range(1000):  # 1000 requests, each wanting a retry
        budget.deposit()
        granted += budget.try_spend()
    assert granted == 200  # 20% extra load
    clock.now += 1
    budget2 = RetryBudget(ratio=0.0, min_per_second=3.0, clock=clock)
    for _ in range(50):
        budget2.try_spend()
    clock.now += 2
    assert sum(budget2.try_spend() for _ in range(10)) == 6
