"""The gateway's automatic canaries: one controller per route with ``canary.auto``, kept across
reloads that leave the canary unchanged, ticked once a second, and their metrics.

Each worker routes by the saved state's weight and keeps the evidence of its own requests;
the worker holding the judge lock decides from its share (``SO_REUSEPORT`` spreads
connections over the workers, so its share is a sample of the route's traffic).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.base.context import RequestContext
from gateway.base.finished_requests import outcome_status
from gateway.control.canary.controller import CanaryController
from gateway.control.canary.state import STATUSES, CanaryState
from gateway.control.canary.stores import StatePlace, state_place
from policies.schema import Policy, WeightedPool

log = logging.getLogger("kvgate.gateway")

TICK_INTERVAL = 1.0  # seconds


class Canaries:
    def __init__(
        self,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
        tick_interval: float = TICK_INTERVAL,
    ) -> None:
        self.clock = clock
        self.tick_interval = tick_interval
        self.controllers: dict[str, CanaryController] = {}
        # ticks and operators' actions run in worker threads: one at a time
        self._changing = threading.Lock()
        self._places: dict[str, StatePlace] = {}  # where each route's state is kept
        self.weight = Gauge(
            "kvgate_canary_weight",
            "Percent of the route's requests sent to each pool of its automatic canary.",
            ["route", "pool"],
            registry=registry,
            multiprocess_mode="max",
        )
        self.step = Gauge(
            "kvgate_canary_step",
            "The automatic canary's step (0 is the first).",
            ["route"],
            registry=registry,
            multiprocess_mode="max",
        )
        self.status = Gauge(
            "kvgate_canary_status",
            "1 for the automatic canary's status: running, paused, promoted, rolled_back.",
            ["route", "status"],
            registry=registry,
            multiprocess_mode="max",
        )
        self.decisions = Counter(
            "kvgate_canary_decisions",
            "Decisions of automatic canaries: promote, complete, rollback (by the gates or "
            "an operator), pause, resume, restart.",
            ["route", "decision", "by"],
            registry=registry,
        )
        self.held = Gauge(
            "kvgate_canary_held_by_budget",
            "1 while the route's SLO error budget is too spent for its canary to start or "
            "advance (canary.auto.budget_freeze).",
            ["route"],
            registry=registry,
            multiprocess_mode="max",
        )
        # the share of a route's SLO error budgets spent (the SLO tracker's; set by the app)
        self.budget_spent: Callable[[str], float | None] = lambda route: None
        self.gate_value = Gauge(
            "kvgate_canary_gate_ratio",
            "The canary's figure over its gate's limit at the last judgement (above 1: breached).",
            ["route", "gate"],
            registry=registry,
            multiprocess_mode="max",
        )

    def update(self, policy: Policy) -> None:
        """Control the policy's automatic canaries; an unchanged one keeps its controller."""
        with self._changing:
            self._update(policy)

    def _update(self, policy: Policy) -> None:
        autos = [route for route in policy.routes if route.auto_canary is not None]
        place = state_place(policy) if autos else None
        now = self.clock()
        kept = self.controllers
        self.controllers = {}
        for route in autos:
            assert place is not None
            auto = route.auto_canary
            old = kept.pop(route.model, None)
            if old is not None and old.auto == auto and self._places.get(route.model) == place:
                old.has_shadow = route.shadow is not None
                self.controllers[route.model] = old
                continue
            if old is not None and old.store is not None:
                old.store.close()
            store = place.store("canary", route.model, CanaryState.from_json)
            spent = self.budget_spent(route.model)
            self.controllers[route.model] = CanaryController(route, store, now, spent)
            self._places[route.model] = place
        for gone in kept.values():
            if gone.store is not None:
                gone.store.close()
        self._export()

    def split(self, model: str) -> tuple[WeightedPool, ...] | None:
        """The route's pools and their weights now; None when it has no automatic canary."""
        controller = self.controllers.get(model)
        return controller.weights if controller is not None else None

    def observe(self, ctx: RequestContext) -> None:
        """A finished request of an automatic canary's route (``ctx.canary_arm`` set)."""
        controller = self.controllers.get(ctx.model)
        if controller is None:
            return
        controller.observe(ctx.canary_arm, outcome_status(ctx), ctx.ttft, ctx.tpot)

    def shadow_result(self, model: str, result: str) -> None:
        controller = self.controllers.get(model)
        if controller is not None:
            controller.shadow_result(result)

    def tick(self, spent: dict[str, float | None] | None = None) -> None:
        """Tick every canary (``spent``: each route's share of its SLO budgets spent, read on
        the event loop, where the SLO tracker counts)."""
        with self._changing:
            self._tick(spent or {})

    def _tick(self, spent: dict[str, float | None]) -> None:
        now = self.clock()
        for controller in list(self.controllers.values()):
            try:
                judge = controller.store.is_judge() if controller.store is not None else True
                decisions = controller.tick(now, judge, spent.get(controller.route))
            except OSError as exc:
                log.warning("canary of %s: state file unusable: %s", controller.route, exc)
                continue
            for decision in decisions:
                by = "budget" if decision == "start" else "gates"
                self.decisions.labels(controller.route, decision, by).inc()
            if judge:
                self._export_gates(controller)
        self._export()

    def act(self, model: str, action: str) -> dict[str, object]:
        """An operator's action on the route's canary; its summary after it."""
        controller = self.controllers.get(model)
        if controller is None:
            raise KeyError(model)
        with self._changing:
            decision = controller.act(action, self.clock())
        self.decisions.labels(model, decision, "admin").inc()
        self._export()
        return controller.summary()

    def _export(self) -> None:
        for model, controller in self.controllers.items():
            weight = controller.weight
            self.weight.labels(model, controller.auto.pool).set(weight)
            self.weight.labels(model, controller.auto.baseline).set(100.0 - weight)
            self.step.labels(model).set(controller.state.step)
            self.held.labels(model).set(1 if controller.held_by_budget is not None else 0)
            for status in STATUSES:
                self.status.labels(model, status).set(1 if controller.state.status == status else 0)

    def _export_gates(self, controller: CanaryController) -> None:
        for name, verdict in controller.last_judgement.items():
            limit, value = verdict["limit"], verdict["canary"]
            if isinstance(limit, float) and isinstance(value, float) and limit > 0:
                self.gate_value.labels(controller.route, name).set(value / limit)

    async def run(self) -> None:
        """Tick for as long as the gateway runs (a task of the application), off the event
        loop: a slow state store must not hold up requests."""
        while True:
            await asyncio.sleep(self.tick_interval)
            try:
                spent = {route: self.budget_spent(route) for route in self.controllers}
                await asyncio.to_thread(self.tick, spent)
            except Exception:  # a bug here must not stop the canaries' clock
                log.exception("canary tick failed")

    def close(self) -> None:
        for controller in self.controllers.values():
            if controller.store is not None:
                controller.store.close()
