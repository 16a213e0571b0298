"""The SLO tracker on a clock of its own: events from flushed totals, rolling windows, burn
rates, budgets, and the classes shed once a budget is spent."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from epp.scheduling.registry import CATALOG
from gateway.base.finished_requests import RequestTotals, TotalsKey
from gateway.control.slo.event_window import EventWindow
from gateway.control.slo.tracker import SloTracker
from policies.loader import load_policy_text
from policies.schema import Policy
from tests.fakes import ManualClock

POLICY = """pools: {a: {endpoints: [127.0.0.1:8001]}}
routes: [{model: chat, pool: a}]
slos:
  shed_when_exhausted: %s
  objectives:
    - {route: chat, class: interactive}
    - {route: chat, window: 1d, availability: 99%%}
"""


def policy(shed: bool = False) -> Policy:
    return load_policy_text(POLICY % str(shed).lower(), plugins=CATALOG)


def totals(count: int, ttfts: list[float] = (), tpots: list[float] = ()) -> RequestTotals:  # type: ignore[assignment]
    added = RequestTotals()
    added.count = count
    added.ttfts = list(ttfts)
    added.tpots = list(tpots)
    return added


def key(status: int, priority_class: str = "interactive") -> TotalsKey:
    return ("/v1/chat/completions", "chat", status, priority_class)


def tracker_for(shed: bool = False) -> tuple[SloTracker, ManualClock, CollectorRegistry]:
    clock, registry = ManualClock(1_000_000.0), CollectorRegistry()
    tracker = SloTracker(registry, clock)
    tracker.update(policy(shed))
    return tracker, clock, registry


def by_name(tracker: SloTracker, cls: str = "interactive") -> dict[str, dict[str, object]]:
    return {f"{o['slo']}": o for o in tracker.snapshot() if o["class"] == cls}


def test_events_follow_each_sli_and_the_counter_adds_them() -> None:
    tracker, _, registry = tracker_for()
    tracker.record(
        {
            key(200): totals(4, ttfts=[0.1, 0.2, 0.6, 0.4], tpots=[0.01, 0.05]),
            key(503): totals(2, ttfts=[0.01]),  # errors: availability only
            key(499): totals(5),  # the client left: not counted
            key(200, "batch"): totals(3, ttfts=[9.0, 9.0, 9.0]),  # another class
        }
    )
    slos = by_name(tracker)
    assert (slos["ttft_p95"]["good"], slos["ttft_p95"]["total"]) == (3, 4)
    assert (slos["tpot_p95"]["good"], slos["tpot_p95"]["total"]) == (1, 2)
    assert (slos["availability"]["good"], slos["availability"]["total"]) == (4, 6)
    route_wide = by_name(tracker, "all")["availability"]
    assert (route_wide["good"], route_wide["total"]) == (7, 9)  # every class
    sample = registry.get_sample_value
    labels = {"slo": "ttft_p95", "route": "chat", "class": "interactive"}
    assert sample("kvgate_slo_events_total", {**labels, "good": "true"}) == 3
    assert sample("kvgate_slo_events_total", {**labels, "good": "false"}) == 1
    assert sample("kvgate_slo_target", labels) == 0.95


def test_burn_rates_and_budget() -> None:
    tracker, clock, registry = tracker_for()
    # 1,000 requests an hour ago, 2% of them failed; then 100 requests now, 10% failed
    clock.now -= 3600
    tracker.record({key(200, "batch"): totals(980), key(502, "batch"): totals(20)})
    clock.now += 3600
    tracker.record({key(200, "batch"): totals(90), key(502, "batch"): totals(10)})
    tracker.refresh()
    route_wide = by_name(tracker, "all")["availability"]
    rates = route_wide["burn_rates"]
    assert isinstance(rates, dict)
    assert rates["5m"] == pytest.approx(0.10 / 0.01)  # 10% errors against a 1% budget
    assert rates["2h"] == pytest.approx((30 / 1100) / 0.01)
    # the day's budget: 1% of 1,100 = 11 bad events allowed, 30 spent
    assert route_wide["budget_remaining"] == pytest.approx(1 - 30 / 11)
    labels = {"slo": "availability", "route": "chat", "class": "all"}
    assert registry.get_sample_value("kvgate_slo_budget_remaining", labels) == pytest.approx(
        1 - 30 / 11
    )
    assert registry.get_sample_value(
        "kvgate_slo_burn_rate", {**labels, "window": "5m"}
    ) == pytest.approx(10.0)
    # a day later the window has moved past all of it
    clock.now += 86400 + 3600
    tracker.refresh()
    assert by_name(tracker, "all")["availability"]["total"] == 0
    assert by_name(tracker, "all")["availability"]["budget_remaining"] == 1.0


def test_minute_slots_are_reused_after_three_days() -> None:
    window = EventWindow(7 * 86400)
    window.add(0.0, 1, 2)
    window.add(3 * 86400.0, 5, 5)  # the same minute slot, three days on
    assert window.recent(3 * 86400.0, (60.0, 3 * 86400.0)) == [(5, 5), (5, 5)]
    assert window.whole(3 * 86400.0) == (6, 7)


def test_a_spent_budget_sheds_the_lower_classes_only_when_enabled() -> None:
    for shed in (False, True):
        tracker, _, _ = tracker_for(shed)
        # the interactive objective's 99.9%: 2,000 requests, 10 failed (budget of 2 spent)
        tracker.record({key(200): totals(1990), key(500): totals(10)})
        tracker.refresh()
        expected = {"chat": frozenset({"standard", "batch"})} if shed else {}
        assert tracker.shedding == expected
    # too few events for the budget to hold even one bad event: not shed
    tracker, _, _ = tracker_for(True)
    tracker.record({key(500): totals(1)})
    tracker.refresh()
    assert tracker.shedding == {}


def test_a_reload_keeps_the_windows_of_unchanged_objectives() -> None:
    tracker, _, _ = tracker_for()
    tracker.record({key(200): totals(10, ttfts=[0.1] * 10)})
    tracker.update(policy())
    assert by_name(tracker)["ttft_p95"]["total"] == 10
    tracker.update(load_policy_text(POLICY.replace("99%%", "98%%") % "false", plugins=CATALOG))
    assert by_name(tracker)["ttft_p95"]["total"] == 10  # unchanged
    assert by_name(tracker, "all")["availability"]["total"] == 0  # changed: starts over
