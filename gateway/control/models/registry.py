"""The gateway's model registry: the stages in force for each registered model (saved where the
canaries' state is: a file of the state directory, or Redis when the limits share one), the
routes they resolve to, and the stage changes — an operator's, or a canary's verdict.

The policy as declared is never changed: ``resolve`` gives the policy to run, whose registered
routes take production's pool and, while a version is in canary, an automatic canary against
it. Each worker and replica reads the saved stages every tick and applies a change as a reload
(``gateway.reload``), so a change made through one reaches all within a second or so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, replace

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.control.canary.canaries import TICK_INTERVAL, Canaries
from gateway.control.canary.controller import CanaryController
from gateway.control.canary.state import Store
from gateway.control.canary.stores import StatePlace, state_place
from gateway.control.models.stages import ModelStages, change, in_force
from policies.models_section import STAGES, RegisteredModel
from policies.schema import Policy, Route, WeightedPool

log = logging.getLogger("kvgate.gateway")

# a canary's end, as its controller's status, and the stage change it makes
VERDICTS = {"promoted": "promote", "rolled_back": "rollback"}


class ModelRegistry:
    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.models: dict[str, RegisteredModel] = {}
        self.stages: dict[str, ModelStages] = {}  # in force
        self.stores: dict[str, Store[ModelStages] | None] = {}
        self._place: StatePlace | None = None
        self._changing = threading.Lock()  # ticks and actions run in worker threads
        self.stage = Gauge(
            "kvgate_model_stage",
            "1 for each registered model version's stage: staging, canary, production, archived.",
            ["model", "version", "stage"],
            registry=registry,
            multiprocess_mode="max",
        )
        self.changes = Counter(
            "kvgate_model_stage_changes",
            "Stage changes of registered model versions, by action (promote, rollback, "
            "archive) and by whom (admin: an operator; canary: its verdict).",
            ["model", "action", "by"],
            registry=registry,
        )

    def update(self, policy: Policy) -> None:
        """Take the policy's registered models and read their saved stages (blocking I/O)."""
        with self._changing:
            place = state_place(policy) if policy.models else None
            if place != self._place:
                self._close()
            self._place = place
            self.models = dict(policy.models)
            for name in self.models:
                if name not in self.stores and place is not None:
                    self.stores[name] = place.store("models", name, ModelStages.from_json)
            for name in set(self.stores) - set(self.models):
                store = self.stores.pop(name)
                if store is not None:
                    store.close()
            self.stages = {name: self._read(name) for name in self.models}
            self._export()

    def _read(self, name: str) -> ModelStages:
        """The saved stages in force (saving the declared ones where none are saved); those in
        force before while the store cannot be read."""
        model, store = self.models[name], self.stores.get(name)
        if store is None:
            return self.stages.get(name) or in_force(model, None)
        try:
            saved = store.load()
            if saved is None:
                saved = store.update(lambda saved: saved or in_force(model, None))
            before = self.stages.get(name)
            stages = in_force(model, saved, quiet=True)
            if before is None or stages.stages != before.stages:
                in_force(model, saved)  # what the merge with the policy says, once a change
            return stages
        except OSError as exc:
            log.warning("model %s: saved stages unreadable, keeping those in force: %s", name, exc)
            return self.stages.get(name) or in_force(model, None)

    def tick(self, canaries: Canaries) -> bool:
        """Read the saved stages again and apply the canaries' verdicts; whether the stages in
        force changed (the policy is then to be resolved again)."""
        with self._changing:
            before = {name: stages.stages for name, stages in self.stages.items()}
            self.stages = {name: self._read(name) for name in self.models}
            for name, stages in list(self.stages.items()):
                self._settle(name, stages, canaries)
            self._export()
            return {name: s.stages for name, s in self.stages.items()} != before

    def _settle(self, name: str, stages: ModelStages, canaries: Canaries) -> None:
        """A canary that ended (promoted to 100%, or rolled back) makes its stage change."""
        version = stages.version_in("canary")
        controller = canaries.controllers.get(name)
        if version is None or controller is None or controller.auto.run != stages.canary_run:
            return
        action = VERDICTS.get(controller.state.status)
        if action is not None:
            try:
                self._act(name, version, action, "canary", stages.canary_run)
            except OSError as exc:
                log.warning("model %s: the canary's verdict is not saved yet: %s", name, exc)

    def act(self, name: str, version: str, action: str, by: str) -> ModelStages:
        """An operator's ``action`` on a version (``by``: the operator, as the admin API names
        the caller): saved, then in force here. Raises ``KeyError`` (unknown model or
        version), ``StageConflict``, ``OSError`` (not saved)."""
        with self._changing:
            return self._act(name, version, action, by)

    def _act(
        self, name: str, version: str, action: str, by: str, run: str | None = None
    ) -> ModelStages:
        """``run``: the canary run whose verdict this is (nothing is changed once another
        worker or replica has settled it)."""
        model = self.models[name]
        if model.version(version) is None:
            raise KeyError(version)
        store = self.stores.get(name)
        events: list[dict[str, object]] = []

        def apply(saved: ModelStages | None) -> ModelStages:
            events.clear()  # a compare-and-set may call it again
            stages = in_force(model, saved if store is not None else self.stages[name])
            if run is None or (stages.canary_run == run and stages.stages[version] == "canary"):
                events.append(change(stages, version, action, self.clock(), by))
            return stages

        updated = store.update(apply) if store is not None else apply(None)
        self.stages[name] = in_force(model, updated)
        for event in events:
            level = logging.WARNING if action == "rollback" else logging.INFO
            log.log(level, json.dumps({"model": name, **event}))
            self.changes.labels(name, action, "admin" if run is None else "canary").inc()
        self._export()
        return self.stages[name]

    def resolve(self, policy: Policy) -> Policy:
        """``policy`` with its registered models' routes as the stages in force route them."""
        if not policy.models:
            return policy
        routes = tuple(self._route(route) for route in policy.routes)
        return replace(policy, routes=routes)

    def _route(self, route: Route) -> Route:
        model = self.models.get(route.model)
        if model is None:
            return route
        stages = self.stages.get(model.name) or in_force(model, None)
        production = model.version(stages.version_in("production") or "")
        assert production is not None  # in_force keeps one
        canary = model.version(stages.version_in("canary") or "")
        if canary is None:
            return replace(route, pool=production.pool, canary=(), auto_canary=None)
        auto = replace(
            model.canary, baseline=production.pool, pool=canary.pool, run=stages.canary_run
        )
        first = auto.steps[0]
        split = (
            WeightedPool(production.pool, 100.0 - first, production.pool),
            WeightedPool(canary.pool, first, canary.pool),
        )
        return replace(route, pool=production.pool, canary=split, auto_canary=auto)

    def summary(
        self, canaries: Canaries, budget_spent: Callable[[str], float | None]
    ) -> dict[str, object]:
        """Every registered model: its versions with their stages and traffic shares, its
        canary's progress, and its SLO verdict (``budget_spent``: the SLO tracker's)."""
        out: dict[str, object] = {}
        for name, model in self.models.items():
            stages = self.stages.get(name) or in_force(model, None)
            controller = canaries.controllers.get(name)
            if controller is not None and controller.auto.run != stages.canary_run:
                controller = None
            weight = controller.weight if controller is not None and stages.canary_run else 0.0
            shares = {"production": 100.0 - weight, "canary": weight}
            versions = [
                {
                    **asdict(v),
                    "declared_stage": v.stage,
                    "stage": stages.stages.get(v.version, v.stage),
                    "share": shares.get(stages.stages.get(v.version, v.stage), 0.0),
                }
                for v in model.versions
            ]
            out[name] = {
                "versions": versions,
                "canary": _canary(controller) if stages.canary_run else None,
                "slo": _verdict(budget_spent(name), model.canary.budget_freeze),
                "events": stages.events,
            }
        return out

    def _export(self) -> None:
        for name, stages in self.stages.items():
            for version, stage in stages.stages.items():
                for each in STAGES:
                    self.stage.labels(name, version, each).set(1 if stage == each else 0)

    async def run(self, canaries: Canaries, apply: Callable[[], Awaitable[None]]) -> None:
        """Tick once a second for as long as the gateway runs (off the event loop: a slow
        store must not hold up requests), ``apply``-ing the stages whenever they change."""
        while True:
            await asyncio.sleep(TICK_INTERVAL)
            try:
                if await asyncio.to_thread(self.tick, canaries):
                    await apply()
            except Exception:  # a bug here must not stop the registry's clock
                log.exception("model registry tick failed")

    def close(self) -> None:
        with self._changing:
            self._close()

    def _close(self) -> None:
        for store in self.stores.values():
            if store is not None:
                store.close()
        self.stores = {}


def _canary(controller: CanaryController | None) -> dict[str, object]:
    if controller is None:
        return {"status": "starting"}  # the route's canary is set up at the next reload
    return {
        "status": controller.state.status,
        "step": controller.state.step,
        "steps": list(controller.auto.steps),
        "weight": controller.weight,
        "held_by_budget": controller.held_by_budget,
        "gates": controller.last_judgement,
    }


def _verdict(spent: float | None, freeze: float) -> dict[str, object]:
    """The route's SLO error budget: how much is spent, and what that means for a canary."""
    if spent is None:
        verdict = "no data"
    elif spent >= 1.0:
        verdict = "exhausted"
    elif freeze < 1.0 and spent > freeze:
        verdict = f"over {freeze:.0%} spent: canaries wait"
    else:
        verdict = "ok"
    return {"budget_spent": spent, "budget_freeze": freeze, "verdict": verdict}
