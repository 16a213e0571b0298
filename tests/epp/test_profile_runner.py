"""Scheduling cycle, pickers, filters, the registry and plugin params."""

from __future__ import annotations

from dataclasses import replace

import pytest

from epp.framework import Endpoint, Profile, SchedulingRequest, WeightedScorer
from epp.scheduling.config import build_profile
from epp.scheduling.filters.role import RoleFilter
from epp.scheduling.filters.saturation import SaturationFilter
from epp.scheduling.handle import PluginHandle
from epp.scheduling.params import ParamError
from epp.scheduling.pickers.max_score import MaxScorePicker, Params
from epp.scheduling.profile_runner import ProfileRunner
from epp.scheduling.registry import BUILTINS, build, register
from epp.scheduling.saturation import SaturationDetector
from policies.schema import Epp, Saturation
from tests.epp.builders import make_endpoint, make_request

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


class FixedScorer:
    def __init__(self, name: str, scores: dict[str, float]) -> None:
        self.name = name
        self.scores = scores

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        return self.scores


def test_framework_clamps_and_weights() -> None:
    profile = Profile(
        "p",
        (),
        (
            WeightedScorer(FixedScorer("big", {A: 7.0, B: 0.5, C: -3.0}), 2.0),
            WeightedScorer(FixedScorer("small", {A: 0.0, B: 1.0, C: 1.0}), 1.0),
        ),
        MaxScorePicker("pick", Params(seed=1)),
    )
    result = ProfileRunner(profile).schedule(make_request(), [make_endpoint(a) for a in (A, B, C)])
    assert result.scores == {A: 2.0, B: 2.0, C: 1.0}  # 7 clamped to 1, -3 to 0
    assert {e.address for e in result.ranked[:2]} == {A, B} and result.ranked[2].address == C


def test_ties_are_broken_at_random() -> None:
    picker = MaxScorePicker("pick", Params())
    endpoints = [make_endpoint(a) for a in (A, B, C)]
    firsts = {
        picker.pick(make_request(), [(e, 1.0) for e in endpoints])[0].address for _ in range(60)
    }
    assert firsts == {A, B, C}


def test_winner_by_names_the_deciding_scorer() -> None:
    profile = Profile(
        "p",
        (),
        (
            WeightedScorer(FixedScorer("prefix", {A: 1.0, B: 0.0}), 3),
            WeightedScorer(FixedScorer("queue", {A: 0.0, B: 1.0}), 2),
        ),
        MaxScorePicker("pick", Params(seed=0)),
    )
    result = ProfileRunner(profile).schedule(make_request(), [make_endpoint(A), make_endpoint(B)])
    assert result.target is not None and result.target.address == A
    assert result.winner_by == "prefix"


def test_saturation_filter_keeps_all_when_all_saturated() -> None:
    handle = PluginHandle(SaturationDetector(Saturation(queue_depth=3)))
    f = SaturationFilter.from_config("sat", {}, handle)
    busy, idle, stale = make_endpoint(A, queue=3), make_endpoint(B), make_endpoint(C, fresh=False)
    assert f.filter(make_request(), [busy, idle, stale]) == [idle]
    assert f.filter(make_request(), [busy, stale]) == [busy, stale]
    burst = make_endpoint(A, queue=1)
    burst.load.dispatched = 2  # sent since the last scrape
    assert f.filter(make_request(), [burst, idle]) == [idle]


def test_role_filters() -> None:
    both, pre, dec = (
        make_endpoint(A),
        make_endpoint(B, role="prefill"),
        make_endpoint(C, role="decode"),
    )
    assert RoleFilter.decode("d", {}).filter(make_request(), [both, pre, dec]) == [both, dec]
    assert RoleFilter.prefill("p", {}).filter(make_request(), [both, pre, dec]) == [both, pre]


def test_registry_refuses_duplicates_and_unknown_types() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register("queue-scorer", BUILTINS["queue-scorer"])
    with pytest.raises(ValueError, match="unknown plugin type"):
        build("nope-scorer", "x", {}, PluginHandle())


@pytest.mark.parametrize(
    ("type_name", "params", "message"),
    [
        ("prefix-cache-scorer", {"block_size_tokens": 0}, "out of range"),
        ("prefix-cache-scorer", {"block_size_tokens": "16"}, "expected int"),
        ("prefix-cache-scorer", {"bogus": 1}, "unknown param"),
        ("prefix-cache-scorer", {"cpu_tier_weight": 1.5}, "out of range"),
        ("prefix-cache-scorer", {"storage_tier_weight": -0.1}, "out of range"),
        ("lora-affinity-scorer", {"active": 2.0}, "out of range"),
        ("saturation-filter", {"kv_usage": 0.5}, "set once, in epp.saturation.kv_usage"),
        ("queue-scorer", {"x": 1}, "unknown param"),
    ],
)
def test_plugin_params_are_validated(
    type_name: str, params: dict[str, object], message: str
) -> None:
    with pytest.raises(ParamError, match=message):
        build(type_name, "plugin", params, PluginHandle())


def test_default_profile_puts_cache_affinity_first() -> None:
    profile = build_profile(Epp())
    weights = {ws.scorer.name: ws.weight for ws in profile.scorers}
    assert weights == {
        "backlog": 2,
        "prefix": 3,
        "spread": 2,
        "active": 1,
        "lora": 1,
        "session": 2,
    }
    # the one filter is a no-op unless the gateway places the pool's adapters itself
    assert [f.name for f in profile.filters] == ["adapters"]
    assert profile.picker.name == "pick"


def test_health_filter_keeps_all_when_none_is_healthy() -> None:
    from epp.scheduling.filters.health import HealthFilter

    up, down = make_endpoint(A), make_endpoint(B)
    down.healthy = False
    f = HealthFilter.from_config("health", {})
    assert f.filter(make_request(), [up, down]) == [up]
    up.healthy = False
    assert f.filter(make_request(), [up, down]) == [up, down]


def test_model_filter_uses_declared_models() -> None:
    from epp.scheduling.filters.health import ModelFilter

    base, sql, anything = make_endpoint(A), make_endpoint(B), make_endpoint(C)
    base.spec = replace(base.spec, labels={"models": "m"})
    sql.spec = replace(sql.spec, labels={"models": "m, sql"})
    f = ModelFilter.from_config("models", {})
    assert f.filter(make_request(lora="sql"), [base, sql, anything]) == [sql, anything]
    assert f.filter(make_request(), [base, sql, anything]) == [base, sql, anything]
    assert f.filter(make_request(model="other"), [base, sql, anything]) == [anything]
