"""The ``slos:`` section and a route's canary mapping (fixed weight or ``auto``): what they
load to, and the errors that name the field."""

from __future__ import annotations

import pytest

from epp.scheduling.registry import CATALOG
from policies.errors import PolicyError
from policies.loader import load_policy_text
from policies.schema import Policy
from policies.slo_section import PRESETS

POOLS = "pools:\n  a: {endpoints: [127.0.0.1:8001]}\n  b: {endpoints: [127.0.0.1:8002]}\n"


def load(text: str) -> Policy:
    return load_policy_text(POOLS + text, plugins=CATALOG)


def errors_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as err:
        load(text)
    return err.value.errors


def test_a_class_named_like_a_preset_takes_it_and_star_covers_every_route() -> None:
    policy = load("""routes:
  - {model: chat, pool: a}
  - {model: embed, pool: b}
slos:
  objectives:
    - {route: chat, class: interactive}
    - {route: "*", window: 7d, ttft_p99: 2s, availability: 99.5%}
""")
    first, *rest = policy.slos.slos
    assert (first.route, first.priority_class, first.window) == ("chat", "interactive", 28 * 86400)
    assert first.objectives == PRESETS["interactive"]
    assert {o.name: (o.target, o.threshold) for o in first.objectives} == {
        "ttft_p95": (0.95, 0.5),
        "tpot_p95": (0.95, 0.04),
        "availability": (0.999, 0.0),
    }
    assert [s.route for s in rest] == ["chat", "embed"]
    assert {o.name: (o.target, o.threshold) for o in rest[0].objectives} == {
        "availability": (0.995, 0.0),
        "ttft_p99": (0.99, 2.0),
    }
    assert rest[0].window == 7 * 86400
    assert policy.slos.shed_when_exhausted is False


def test_a_preset_is_overridden_field_by_field() -> None:
    policy = load("""routes: [{model: chat, pool: a}]
slos:
  shed_when_exhausted: true
  objectives: [{route: chat, preset: realtime, availability: 0.99}]
""")
    (slo,) = policy.slos.slos
    assert {o.name: o.target for o in slo.objectives} == {"ttft_p95": 0.95, "availability": 0.99}
    assert policy.slos.shed_when_exhausted is True


def test_slo_errors_name_the_field() -> None:
    assert errors_of("""routes: [{model: chat, pool: a}]
slos:
  objectives:
    - {route: nope, class: gold, availability: 100%}
    - {route: chat}
    - {route: chat, preset: fast, window: 10m, ttft_p95: 0s}
    - {route: chat, ttft_p50: 1s}
    - {route: chat, ttft_p50: 2s}
""") == [
        "slos.objectives[0].route (line 7): 'nope' is not a routed model (or '*' for every route)",
        "slos.objectives[0].class (line 7): unknown priority class 'gold'",
        "slos.objectives[0].availability (line 7): must be a share like 99.9% or 0.999, below"
        " 100%; got '100%'",
        "slos.objectives[1] (line 8): needs a preset or at least one objective (availability,"
        " ttft_p95, ...)",
        "slos.objectives[2].preset (line 9): must be one of interactive, batch, realtime; got"
        " 'fast'",
        "slos.objectives[2].ttft_p95 (line 9): must be a positive duration",
        "slos.objectives[2].window (line 9): must be at least 1h",
        "slos.objectives[4] (line 11): ttft_p50 of route 'chat' is declared twice",
    ]


def test_auto_canary_loads_with_its_first_step_as_the_weight() -> None:
    policy = load("""routes:
  - model: chat
    pool: a
    canary:
      pool: b
      auto: {steps: [5, 50, 100], hold: 2s, min_requests: 20,
             gates: {error_rate: 1.5x, tpot_p95: false, shadow_mismatch: 0.1}}
  - {model: fixed, pool: a, canary: {pool: b, weight: 10}}
""")
    chat, fixed = policy.routes
    assert chat.pool == "a"
    assert [(p.pool, p.weight) for p in chat.canary] == [("a", 95.0), ("b", 5.0)]
    auto = chat.auto_canary
    assert auto is not None
    assert (auto.baseline, auto.pool, auto.steps, auto.hold, auto.min_requests) == (
        "a",
        "b",
        (5.0, 50.0, 100.0),
        2.0,
        20,
    )
    assert (auto.gates.error_rate, auto.gates.ttft_p95, auto.gates.tpot_p95) == (1.5, 1.1, None)
    assert auto.gates.shadow_mismatch == 0.1
    assert [(p.pool, p.weight) for p in fixed.canary] == [("a", 90.0), ("b", 10.0)]
    assert fixed.auto_canary is None


def test_canary_mapping_errors_name_the_field() -> None:
    assert errors_of("""routes:
  - {model: m1, canary: {pool: b, weight: 5}}
  - {model: m2, pool: a, canary: {pool: a, auto: {steps: [50, 10]}}}
  - {model: m3, pool: a, canary: {pool: zz, weight: 5, auto: {}}}
  - {model: m4, pool: a, canary: {pool: b, auto: {steps: [10, 50], gates: {error_rate: 0.5}}}}
""") == [
        "routes[0].pool (line 5): is required with a canary mapping (the baseline pool)",
        "routes[1].canary.pool (line 6): must differ from the route's pool",
        "routes[1].canary.auto.steps (line 6): steps must increase",
        "routes[1].canary.auto.steps (line 6): the last step must be 100 (the canary takes"
        " every request)",
        "routes[2].canary (line 7): needs exactly one of weight (percent) or auto",
        "routes[2].canary.pool (line 7): unknown pool 'zz' (pools: a, b)",
        "routes[3].canary.auto.steps (line 8): the last step must be 100 (the canary takes"
        " every request)",
        "routes[3].canary.auto.gates.error_rate (line 8): must be at least 1 (a ratio to the"
        " baseline); got 0.5",
    ]
