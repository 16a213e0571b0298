"""Canaries that wait for the error budget: with more than ``budget_freeze`` of its route's SLO
error budget spent (a real SLO tracker, fed failed requests), a new canary does not start (it
takes no traffic) and a running one does not advance; once the budget recovers it starts, and
the hold is counted, shown and logged."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from epp.scheduling.registry import CATALOG
from gateway.base.finished_requests import RequestTotals
from gateway.control.canary.canaries import Canaries
from gateway.control.slo.tracker import SloTracker
from policies.loader import load_policy_text
from policies.schema import Policy
from tests.fakes import ManualClock, close_after_test

POLICY = """pools: {{a: {{endpoints: [127.0.0.1:8001]}}, b: {{endpoints: [127.0.0.1:8002]}}}}
routes:
  - model: chat
    pool: a
    {canary}
slos:
  objectives: [{{route: chat, window: 1h, availability: 99%}}]
state_dir: {state}
"""
CANARY = "canary: {pool: b, auto: {steps: [10, 50, 100], hold: 60s, min_requests: 20}}"


def policy(state: Path, canary: str = CANARY) -> Policy:
    return load_policy_text(POLICY.format(canary=canary, state=state), plugins=CATALOG)


def served(count: int) -> RequestTotals:
    totals = RequestTotals()
    totals.count = count
    return totals


def spend(slos: SloTracker, failed: int, good: int) -> None:
    """Requests of the route, as the gateway's metrics flush hands them to the tracker."""
    route = ("/v1/chat/completions", "chat")
    slos.record(
        {(*route, 200, "standard"): served(good), (*route, 502, "standard"): served(failed)}
    )


def stack(state: Path) -> tuple[SloTracker, Canaries, ManualClock, CollectorRegistry]:
    clock, registry = ManualClock(1_000_000.0), CollectorRegistry()
    slos = SloTracker(registry, clock)
    slos.update(policy(state, canary=""))
    canaries = close_after_test(Canaries(registry, clock))
    canaries.budget_spent = slos.budget_spent
    return slos, canaries, clock, registry


def spent_now(slos: SloTracker) -> dict[str, float | None]:
    return {"chat": slos.budget_spent("chat")}


def test_a_canary_does_not_start_while_the_budget_is_spent(tmp_path: Path) -> None:
    slos, canaries, clock, registry = stack(tmp_path)
    spend(slos, failed=9, good=991)  # 0.9% failed of a 1% budget: 90% of it spent
    assert slos.budget_spent("chat") == pytest.approx(0.9)
    slos.update(policy(tmp_path))
    canaries.update(policy(tmp_path))  # the canary is added while the budget is spent
    controller = canaries.controllers["chat"]
    assert (controller.state.status, controller.weight) == ("waiting", 0.0)
    assert [pool.weight for pool in canaries.split("chat") or ()] == [100.0, 0.0]
    canaries.tick(spent_now(slos))
    assert controller.state.status == "waiting"
    assert registry.get_sample_value("kvgate_canary_held_by_budget", {"route": "chat"}) == 1
    summary = controller.summary()
    assert summary["held_by_budget"] == pytest.approx(0.9) and summary["budget_freeze"] == 0.8
    clock.now += 3601  # the window's failures age out: nothing is spent
    canaries.tick(spent_now(slos))
    assert (controller.state.status, controller.weight) == ("running", 10.0)
    assert controller.state.events[-1]["decision"] == "start"
    labels = {"route": "chat", "decision": "start", "by": "budget"}
    assert registry.get_sample_value("kvgate_canary_decisions_total", labels) == 1
    assert registry.get_sample_value("kvgate_canary_held_by_budget", {"route": "chat"}) == 0


def test_a_running_canary_does_not_advance_while_the_budget_is_spent(tmp_path: Path) -> None:
    slos, canaries, clock, _ = stack(tmp_path)
    slos.update(policy(tmp_path))
    canaries.update(policy(tmp_path))
    controller = canaries.controllers["chat"]
    for arm in (controller.auto.baseline, controller.auto.pool):
        for _ in range(30):
            controller.observe(arm, 200, 0.1, 0.02)
    spend(slos, failed=50, good=950)  # 5% failed: the budget five times over
    clock.now += 61
    canaries.tick(spent_now(slos))
    assert (controller.state.step, controller.weight) == (0, 10.0)  # held, not rolled back
    clock.now += 3601
    canaries.tick(spent_now(slos))
    assert (controller.state.step, controller.weight) == (1, 50.0)


def test_an_operator_may_start_a_canary_the_budget_holds(tmp_path: Path) -> None:
    slos, canaries, _, _ = stack(tmp_path)
    spend(slos, failed=20, good=980)
    slos.update(policy(tmp_path))
    canaries.update(policy(tmp_path))
    assert canaries.act("chat", "start")["status"] == "running"


def test_a_freeze_of_1_never_waits(tmp_path: Path) -> None:
    slos, canaries, _, _ = stack(tmp_path)
    spend(slos, failed=20, good=980)  # twice the budget
    unfrozen = CANARY.replace("min_requests: 20", "min_requests: 20, budget_freeze: 1")
    slos.update(policy(tmp_path, unfrozen))
    canaries.update(policy(tmp_path, unfrozen))
    assert canaries.controllers["chat"].state.status == "running"
