"""The gateway's SLOs: each flush's finished requests become good and total events of every
objective they fall under, counted in ``kvgate_slo_events_total`` (which adds up across
workers and replicas in Prometheus) and in this process's rolling windows, from which the
burn rates, the remaining budgets and the classes to shed are computed.

An objective's events: availability counts every request of its route (and class) but those
the client gave up on (499), good when not a 5xx; a latency objective counts the successful
(2xx) requests, good when their TTFT (first byte to the client; for a whole JSON answer, its
arrival) or their TPOT (streams of two tokens or more) is within the threshold.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.base.errors import SloShed
from gateway.base.finished_requests import RequestTotals, TotalsKey
from gateway.control.outcomes import counted, failed, succeeded
from gateway.control.slo.event_window import EventWindow
from policies.schema import Policy, PriorityClass
from policies.slo_section import Slo, SloObjective

# the multi-window pairs of Google's SRE workbook: 1h/5m (fast burn), 6h/30m, 1d/2h, 3d/6h
BURN_WINDOWS = {"5m": 300.0, "30m": 1800.0, "1h": 3600.0, "2h": 7200.0, "6h": 21600.0}
BURN_WINDOWS |= {"1d": 86400.0, "3d": 259200.0}
GAUGE_INTERVAL = 5.0  # seconds between recomputations of the burn rates and budgets


@dataclass(eq=False)
class TrackedObjective:
    slo: Slo
    objective: SloObjective
    window: EventWindow

    @property
    def key(self) -> tuple[object, ...]:
        return (self.slo.route, self.slo.priority_class, self.slo.window, self.objective)

    def events(self, status: int, totals: RequestTotals) -> tuple[int, int]:
        """(good, total) of one flush's totals of a status."""
        objective = self.objective
        if not counted(status):
            return 0, 0
        if objective.sli == "availability":
            return (0 if failed(status) else totals.count), totals.count
        if not succeeded(status):
            return 0, 0
        values = totals.ttfts if objective.sli == "ttft" else totals.tpots
        threshold = objective.threshold
        return sum(1 for value in values if value <= threshold), len(values)

    def budget(self, now: float) -> tuple[float, int]:
        """(the share of the window's error budget left, the window's events); below 0 when
        overspent."""
        good, total = self.window.whole(now)
        allowed = total * (1.0 - self.objective.target)
        return (1.0 - (total - good) / allowed if allowed > 0 else 1.0), total

    def burn_rates(self, now: float) -> dict[str, float]:
        """How fast the budget burns over each of ``BURN_WINDOWS``: 1 spends it exactly in the
        objective's window."""
        allowed = 1.0 - self.objective.target
        counts = self.window.recent(now, tuple(BURN_WINDOWS.values()))
        return {
            name: ((total - good) / total / allowed if total else 0.0)
            for name, (good, total) in zip(BURN_WINDOWS, counts, strict=True)
        }


class SloTracker:
    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.objectives: list[TrackedObjective] = []
        self._by_route: dict[tuple[str, str], list[TrackedObjective]] = {}
        self.shed_when_exhausted = False
        self.classes: Mapping[str, PriorityClass] = {}
        # route -> the priority classes refused while one of its budgets is spent
        self.shedding: dict[str, frozenset[str]] = {}
        self._gauges_at = 0.0
        labels = ["slo", "route", "class"]
        self.events = Counter(
            "kvgate_slo_events",
            "SLO events by objective, route, class and whether they were good.",
            [*labels, "good"],
            registry=registry,
        )
        self.target = Gauge(
            "kvgate_slo_target",
            "Each objective's target share of good events.",
            labels,
            registry=registry,
            multiprocess_mode="max",
        )
        self.burn_rate = Gauge(
            "kvgate_slo_burn_rate",
            "This process's burn rate of the objective's budget over the window (1: spent "
            "exactly in the objective's window); per process: the events counter is the sum.",
            [*labels, "window"],
            registry=registry,
            multiprocess_mode="all",
        )
        self.budget_remaining = Gauge(
            "kvgate_slo_budget_remaining",
            "This process's share of the objective's error budget left in its window (below 0 "
            "when overspent); per process: the events counter is the sum.",
            labels,
            registry=registry,
            multiprocess_mode="all",
        )

    def shed(self, model: str, priority_class: str) -> None:
        """Refuse a request of ``priority_class`` to ``model`` while a budget of its route is
        spent and the policy sheds that class (``SloShed``, 503 with a retry-after)."""
        if priority_class in self.shedding.get(model, ()):
            raise SloShed(
                f"an SLO budget of `{model}` is spent; {priority_class} requests are shed "
                "until it recovers",
                headers={"retry-after": "30"},
            )

    def update(self, policy: Policy) -> None:
        """Track the policy's objectives, keeping the windows of those that did not change."""
        kept = {tracked.key: tracked for tracked in self.objectives}
        self.objectives = []
        for slo in policy.slos.slos:
            for objective in slo.objectives:
                fresh = TrackedObjective(slo, objective, EventWindow(slo.window))
                tracked = kept.get(fresh.key, fresh)
                self.objectives.append(tracked)
                self.target.labels(objective.name, slo.route, slo.class_label).set(objective.target)
        self._by_route = {}
        self.shed_when_exhausted = policy.slos.shed_when_exhausted
        self.classes = policy.classes
        self._gauges_at = 0.0

    def _tracked(self, route: str, priority_class: str) -> list[TrackedObjective]:
        key = (route, priority_class)
        found = self._by_route.get(key)
        if found is None:
            found = self._by_route[key] = [
                t
                for t in self.objectives
                if t.slo.route == route and t.slo.priority_class in (None, priority_class)
            ]
        return found

    def record(self, totals: Mapping[TotalsKey, RequestTotals]) -> None:
        """Count one flush's finished requests (``GatewayMetrics.finished_sink``)."""
        if not self.objectives:
            return
        now = self.clock()
        for (_path, model, status, priority_class), added in totals.items():
            for tracked in self._tracked(model, priority_class):
                good, total = tracked.events(status, added)
                if not total:
                    continue
                tracked.window.add(now, good, total)
                labels = (tracked.objective.name, model, tracked.slo.class_label)
                if good:
                    self.events.labels(*labels, "true").inc(good)
                if total > good:
                    self.events.labels(*labels, "false").inc(total - good)
        if now - self._gauges_at >= GAUGE_INTERVAL:
            self.refresh(now)

    def refresh(self, now: float | None = None) -> None:
        """Recompute the burn-rate and budget gauges, and the classes to shed."""
        now = self.clock() if now is None else now
        self._gauges_at = now
        shedding: dict[str, set[str]] = {}
        for tracked in self.objectives:
            slo, name = tracked.slo, tracked.objective.name
            budget, total = tracked.budget(now)
            self.budget_remaining.labels(name, slo.route, slo.class_label).set(budget)
            for window, rate in tracked.burn_rates(now).items():
                self.burn_rate.labels(name, slo.route, slo.class_label, window).set(rate)
            # spent, once the window holds enough events for its budget to be one bad event
            if budget <= 0 and total * (1.0 - tracked.objective.target) >= 1:
                shedding.setdefault(slo.route, set()).update(self._below(slo.priority_class))
        self.shedding = (
            {route: frozenset(names) for route, names in shedding.items() if names}
            if self.shed_when_exhausted
            else {}
        )

    def budget_spent(self, route: str) -> float | None:
        """The largest share of the route's error budgets spent in their windows (above 1 when
        overspent); None while no objective of the route has events enough for its budget to
        be one bad event."""
        now = self.clock()
        spent = None
        for tracked in self.objectives:
            if tracked.slo.route != route:
                continue
            budget, total = tracked.budget(now)
            if total * (1.0 - tracked.objective.target) >= 1:
                spent = max(spent or 0.0, 1.0 - budget)
        return spent

    def _below(self, protected: str | None) -> set[str]:
        """The classes served before ``protected`` goes without: those of lower weight (for a
        route-wide objective, every class but the heaviest)."""
        if not self.classes:
            return set()
        weights = {name: c.weight for name, c in self.classes.items()}
        top = weights.get(protected, 0.0) if protected else max(weights.values())
        return {name for name, weight in weights.items() if weight < top}

    def snapshot(self) -> list[dict[str, object]]:
        """Every objective's figures, for ``GET /admin/slo`` (this process's windows)."""
        now = self.clock()
        out: list[dict[str, object]] = []
        for tracked in self.objectives:
            slo, objective = tracked.slo, tracked.objective
            good, total = tracked.window.whole(now)
            budget, _ = tracked.budget(now)
            out.append(
                {
                    "route": slo.route,
                    "class": slo.class_label,
                    "slo": objective.name,
                    "sli": objective.sli,
                    "target": objective.target,
                    "threshold_seconds": objective.threshold or None,
                    "window_seconds": slo.window,
                    "good": good,
                    "total": total,
                    "budget_remaining": budget,
                    "burn_rates": tracked.burn_rates(now),
                    "shedding": sorted(self.shedding.get(slo.route, ())),
                }
            )
        return out
