"""A route's canary as a mapping: the route's ``pool`` is the baseline, ``canary.pool`` the
candidate, at a fixed ``weight`` (percent) or advanced by the gateway itself (``auto``)::

    routes:
      - model: chat
        pool: stable
        canary:
          pool: candidate
          auto:
            steps: [1, 10, 50, 100]     # percent of the route's requests, in order
            hold: 1h                    # each step lasts at least this long
            min_requests: 500           # on each arm, before a step is judged
            gates: {error_rate: 1.2x, ttft_p95: 1.1x, tpot_p95: 1.1x, shadow_mismatch: 0.05}

A step advances when, over its hold and with ``min_requests`` on both arms, every gate holds
against the baseline arm; a breached gate rolls the canary back to 0 and stops it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from policies.fields import Fields, child

_FACTOR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*x\s*$")


@dataclass(frozen=True)
class CanaryGates:
    """The canary arm against the baseline arm: ratios of the baseline's figure (``None``
    turns a gate off); ``shadow_mismatch`` is an absolute share of the route's shadow copies."""

    error_rate: float | None = 1.2
    ttft_p95: float | None = 1.1
    tpot_p95: float | None = 1.1
    shadow_mismatch: float | None = 0.05
    # error rates below this share are compared as this share (one error in 500 requests
    # against none is noise, not a breach)
    error_floor: float = 0.005


@dataclass(frozen=True)
class AutoCanary:
    baseline: str  # pool
    pool: str  # the canary's pool
    steps: tuple[float, ...] = (1.0, 10.0, 50.0, 100.0)  # percent
    hold: float = 3600.0  # seconds
    min_requests: int = 500
    gates: CanaryGates = CanaryGates()
    # the canary starts and advances only while less than this share of its route's SLO
    # error budgets is spent (1: whatever is spent)
    budget_freeze: float = 0.8
    # one run of a model registry's canary (its version and start): a new run starts over
    run: str = ""

    @property
    def fingerprint(self) -> str:
        """What a saved state must match to be resumed (a changed canary starts over)."""
        fields = (self.baseline, self.pool, self.steps, self.hold, self.min_requests, self.gates)
        return repr((*fields, self.run) if self.run else fields)


def load_canary_mapping(f: Fields, baseline: str) -> tuple[str, float, AutoCanary | None]:
    """The mapping form's (pool, weight percent, auto); ``f`` is the route."""
    c = f.sub("canary", {"pool", "weight", "auto"})
    pool = c.text("pool")
    if not baseline:
        f.error(child(f.path, "pool"), "is required with a canary mapping (the baseline pool)")
    if pool and pool == baseline:
        c.error(child(c.path, "pool"), "must differ from the route's pool")
    if c.has("auto") == c.has("weight"):
        c.error(c.path, "needs exactly one of weight (percent) or auto")
    if not c.has("auto"):
        return pool, c.number("weight", 0.0, low=0.0, high=100.0), None
    auto = load_auto(c.sub("auto", AUTO_FIELDS), baseline, pool)
    return pool, auto.steps[0], auto


AUTO_FIELDS = {"steps", "hold", "min_requests", "gates", "budget_freeze"}


def load_auto(a: Fields, baseline: str, pool: str) -> AutoCanary:
    """An ``auto`` mapping (its fields: ``AUTO_FIELDS``) for a canary of ``pool`` against
    ``baseline``."""
    steps = _steps(a)
    g = a.sub("gates", {"error_rate", "ttft_p95", "tpot_p95", "shadow_mismatch", "error_floor"})
    d = CanaryGates()
    gates = CanaryGates(
        _factor(g, "error_rate", d.error_rate),
        _factor(g, "ttft_p95", d.ttft_p95),
        _factor(g, "tpot_p95", d.tpot_p95),
        None
        if g.raw("shadow_mismatch") is False
        else g.number("shadow_mismatch", d.shadow_mismatch, low=0.0, high=1.0),
        g.number("error_floor", d.error_floor, low=0.0, high=1.0),
    )
    return AutoCanary(
        baseline,
        pool,
        steps,
        a.duration("hold", AutoCanary.hold),
        a.integer("min_requests", AutoCanary.min_requests, low=1),
        gates,
        a.number("budget_freeze", AutoCanary.budget_freeze, low=0.0, high=1.0),
    )


def _steps(a: Fields) -> tuple[float, ...]:
    raw = a.raw("steps")
    if raw is None:
        return AutoCanary.steps
    path = child(a.path, "steps")
    if not isinstance(raw, list) or not raw:
        a.error(path, "must be a non-empty list of percentages")
        return AutoCanary.steps
    steps: list[float] = []
    for value in raw:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 100:
            a.error(path, f"each step is a percentage in (0, 100]; got {value!r}")
            return AutoCanary.steps
        steps.append(float(value))
    if steps != sorted(set(steps)):
        a.error(path, "steps must increase")
    if steps[-1] != 100:
        a.error(path, "the last step must be 100 (the canary takes every request)")
    return tuple(steps)


def _factor(g: Fields, key: str, default: float | None) -> float | None:
    """A ratio like ``1.2x`` or ``1.2``; ``false`` turns the gate off."""
    value = g.raw(key)
    if value is None:
        return default
    if value is False:
        return None
    if isinstance(value, str) and (match := _FACTOR.match(value)):
        factor = float(match.group(1))
    elif isinstance(value, int | float) and not isinstance(value, bool):
        factor = float(value)
    else:
        g.error(child(g.path, key), f"must be a ratio like 1.2x, or false; got {value!r}")
        return default
    if factor < 1:
        g.error(child(g.path, key), f"must be at least 1 (a ratio to the baseline); got {factor}")
    return factor
