"""One route's automatic canary: its arms' evidence for the current step, the gates, and the
decisions (promote a step, roll back), by the gates or forced from the admin API."""

from __future__ import annotations

import json
import logging
import random

from gateway.control.canary.arm_stats import ArmStats
from gateway.control.canary.state import CanaryState, CanaryStore
from policies.canary_section import AutoCanary
from policies.schema import Route, WeightedPool

log = logging.getLogger("kvgate.gateway")

MIN_SHADOW_COMPARISONS = 20  # before the shadow_mismatch gate is judged
ACTIONS = ("pause", "resume", "start", "promote", "rollback", "restart")


class CanaryController:
    def __init__(
        self, route: Route, store: CanaryStore | None, now: float, spent: float | None = None
    ) -> None:
        """``spent``: the share of the route's SLO error budgets spent now (None: unknown); a
        new canary waits, at no traffic, while it is over ``budget_freeze``."""
        assert route.auto_canary is not None
        self.route = route.model
        self.auto: AutoCanary = route.auto_canary
        self.has_shadow = route.shadow is not None
        self.store = store
        self._rng = random.Random(route.model)
        try:
            saved = store.load() if store is not None else None
        except OSError as exc:  # adopted later, when the store answers (its generation is newer)
            log.warning("canary of %s starts without its saved state: %s", self.route, exc)
            saved = None
        if saved is not None and saved.fingerprint == self.auto.fingerprint:
            self.state = saved
        else:
            self.state = CanaryState(self.auto.fingerprint, now)
            if self._frozen(spent):
                self.state.status = "waiting"
                event = {"at": now, "decision": "wait", "by": "budget", **self._budget(spent)}
                self.state.record(event)
                log.info(json.dumps({"canary": self.route, **event}))
            self._save()
        self.weights: tuple[WeightedPool, ...] = ()
        self.last_judgement: dict[str, dict[str, object]] = {}  # the gates at the last tick
        # the spent share of the route's error budget holding the canary, while it does
        self.held_by_budget = spent if self._frozen(spent) else None
        self._fresh_step()

    # -- evidence --------------------------------------------------------------------------

    def _fresh_step(self) -> None:
        self.arms = {self.auto.baseline: ArmStats(self._rng), self.auto.pool: ArmStats(self._rng)}
        self.shadow = {"match": 0, "mismatch": 0}
        self._seen = (self.state.step, self.state.status, self.state.step_started)
        share = self.weight
        self.weights = (
            WeightedPool(self.auto.baseline, 100.0 - share, self.auto.baseline),
            WeightedPool(self.auto.pool, share, self.auto.pool),
        )

    @property
    def weight(self) -> float:
        """The canary's share of the route's requests, in percent."""
        return self.weight_of(self.state)

    def observe(self, arm: str, status: int, ttft: float | None, tpot: float | None) -> None:
        stats = self.arms.get(arm)
        if stats is not None:
            stats.observe(status, ttft, tpot)

    def shadow_result(self, result: str) -> None:
        if result in self.shadow:
            self.shadow[result] += 1

    def evidence(self) -> dict[str, object]:
        """Both arms' figures and each gate's verdict (None: not judged yet)."""
        baseline, canary = self.arms[self.auto.baseline], self.arms[self.auto.pool]
        gates = self.auto.gates
        verdicts: dict[str, dict[str, object]] = {}
        if gates.error_rate is not None:
            limit = gates.error_rate * max(baseline.error_rate, gates.error_floor)
            verdicts["error_rate"] = _verdict(canary.error_rate, limit, baseline.error_rate)
        for name, factor in (("ttft_p95", gates.ttft_p95), ("tpot_p95", gates.tpot_p95)):
            ours = getattr(canary, name[:4]).quantile(0.95)
            theirs = getattr(baseline, name[:4]).quantile(0.95)
            if factor is not None and ours is not None and theirs is not None:
                verdicts[name] = _verdict(ours, factor * max(theirs, 1e-3), theirs)
        compared = self.shadow["match"] + self.shadow["mismatch"]
        if gates.shadow_mismatch is not None and self.has_shadow:
            share = self.shadow["mismatch"] / compared if compared else 0.0
            verdict = _verdict(share, gates.shadow_mismatch, None)
            if compared < MIN_SHADOW_COMPARISONS:
                verdict["held"] = None
            verdicts["shadow_mismatch"] = verdict
        return {
            "arms": {"baseline": baseline.summary(), "canary": canary.summary()},
            "shadow": dict(self.shadow),
            "gates": verdicts,
        }

    # -- decisions -------------------------------------------------------------------------

    def tick(self, now: float, judge: bool, spent: float | None = None) -> list[str]:
        """Adopt a newer saved state; as the judge, decide (``spent``: the share of the route's
        SLO error budgets spent). Returns the decisions made here."""
        if self.store is not None:
            saved = self.store.load()
            if (
                saved is not None
                and saved.fingerprint == self.auto.fingerprint
                and saved.generation > self.state.generation
            ):
                self.state = saved
        if (self.state.step, self.state.status, self.state.step_started) != self._seen:
            self._fresh_step()
        frozen = self._frozen(spent)
        self.held_by_budget = spent if frozen else None
        if judge and self.state.status == "waiting" and not frozen:
            return [self._decide("start", now, "budget", self._budget(spent))]
        if not judge or self.state.status != "running":
            return []
        baseline, canary = self.arms[self.auto.baseline], self.arms[self.auto.pool]
        if min(baseline.requests, canary.requests) < self.auto.min_requests:
            return []
        evidence = self.evidence()
        gates = evidence["gates"]
        assert isinstance(gates, dict)
        self.last_judgement = gates
        if any(g["held"] is False for g in gates.values()):
            breached = sorted(name for name, g in gates.items() if g["held"] is False)
            return [self._decide("rollback", now, "gates", evidence, breached=breached)]
        if now - self.state.step_started >= self.auto.hold and not frozen:
            return [self._decide("promote", now, "gates", evidence)]
        return []

    def _frozen(self, spent: float | None) -> bool:
        """Whether so much of the route's error budget is spent that the canary must not start
        or advance."""
        freeze = self.auto.budget_freeze
        return spent is not None and freeze < 1.0 and spent > freeze  # 1: never

    def _budget(self, spent: float | None) -> dict[str, object]:
        """The evidence of a decision the error budget made."""
        return {"budget_spent": spent, "budget_freeze": self.auto.budget_freeze}

    def act(self, action: str, now: float) -> str:
        """An operator's ``action`` (one of ``ACTIONS``); the decision recorded."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r} (expected: {', '.join(ACTIONS)})")
        return self._decide(action, now, "admin", self.evidence())

    def _decide(
        self, action: str, now: float, by: str, evidence: dict[str, object], **extra: object
    ) -> str:
        def change(saved: CanaryState | None) -> CanaryState:
            state = (
                saved
                if saved is not None and saved.fingerprint == self.auto.fingerprint
                else self.state
            )
            before = self.weight_of(state)
            decision = _apply(state, action, len(self.auto.steps), now)
            state.record(
                {
                    "at": now,
                    "decision": decision,
                    "by": by,
                    "from_weight": before,
                    "to_weight": self.weight_of(state),
                    "step": state.step,
                    "evidence": evidence,
                    **extra,
                }
            )
            return state

        updated = self.store.update(change) if self.store is not None else change(self.state)
        if updated is not None:
            self.state = updated
        self._fresh_step()
        event = self.state.events[-1]  # the one just recorded
        decision = str(event["decision"])
        level = logging.WARNING if decision == "rollback" else logging.INFO
        log.log(level, json.dumps({"canary": self.route, **event}, default=str))
        return decision

    def weight_of(self, state: CanaryState) -> float:
        if state.status in ("rolled_back", "waiting"):
            return 0.0
        if state.status == "promoted":
            return 100.0
        return self.auto.steps[min(state.step, len(self.auto.steps) - 1)]

    def _save(self) -> None:
        """Save a fresh state (a new or changed canary) unless one for it is saved already."""
        if self.store is None:
            return
        state = self.state

        def keep_current(saved: CanaryState | None) -> CanaryState:
            if saved is not None and saved.fingerprint == state.fingerprint:
                return saved
            return state

        try:
            self.state = self.store.update(keep_current) or state
        except OSError as exc:
            log.warning("canary of %s: its state is not saved yet: %s", self.route, exc)

    def summary(self) -> dict[str, object]:
        return {
            "route": self.route,
            "baseline": self.auto.baseline,
            "canary": self.auto.pool,
            "status": self.state.status,
            "step": self.state.step,
            "steps": list(self.auto.steps),
            "weight": self.weight,
            "step_started": self.state.step_started,
            "hold_seconds": self.auto.hold,
            "min_requests": self.auto.min_requests,
            "budget_freeze": self.auto.budget_freeze,
            "held_by_budget": self.held_by_budget,
            "evidence": self.evidence(),
            "events": self.state.events,
        }


def _verdict(value: float, limit: float, baseline: float | None) -> dict[str, object]:
    return {"canary": value, "baseline": baseline, "limit": limit, "held": value <= limit}


def _apply(state: CanaryState, action: str, steps: int, now: float) -> str:
    """Change ``state`` by ``action``; the decision's name."""
    if action == "pause":
        if state.status == "running":
            state.status = "paused"
        return "pause"
    if action in ("resume", "start"):  # an operator may start a canary the budget holds
        if state.status in ("paused", "waiting"):
            state.status = "running"
            state.step_started = now  # the evidence starts over
        return action
    if action == "restart":
        state.status, state.step, state.step_started = "running", 0, now
        return "restart"
    if action == "rollback":
        state.status = "rolled_back"
        return "rollback"
    # promote: the next step; the last step (100%) is the promotion's end
    if state.status in ("rolled_back", "promoted"):
        return "none"
    state.step = min(state.step + 1, steps - 1)
    state.step_started = now
    if state.step == steps - 1:
        state.status = "promoted"
        return "complete"
    return "promote"
