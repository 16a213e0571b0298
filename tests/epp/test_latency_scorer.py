"""The TTFT model (learns the pool's costs from first tokens, forgets old ones, ranks like the
token backlog before it has learnt) and the ``latency-scorer`` that reads it, through the
picker's own dispatches and first tokens."""

from __future__ import annotations

import random

import pytest

from epp.datalayer.latency_model import PRIOR, Features, LatencyModel
from epp.scheduling.scorers.latency import LatencyScorer
from epp.service import EppService
from policies.loader import load_policy_text

A, B = "10.0.0.1:8000", "10.0.0.2:8000"
POLICY = f"""
pools: {{p: {{endpoints: [{A}, {B}]}}}}
routes: [{{model: m, pool: p}}]
epp:
  plugins:
    - {{name: prefix, type: prefix-cache-scorer, params: {{chars_per_token: 1}}}}
    - {{name: latency, type: latency-scorer}}
    - {{name: pick, type: max-score-picker}}
  profiles: [{{name: default, plugins: [{{ref: latency}}, {{ref: pick}}]}}]
"""


def _samples(weights: Features, count: int, rng: random.Random) -> list[tuple[Features, float]]:
    out = []
    for _ in range(count):
        x: Features = (1.0, rng.uniform(0, 8), rng.uniform(0, 4), float(rng.randint(0, 30)))
        y = sum(w * v for w, v in zip(weights, x, strict=True)) * rng.uniform(0.95, 1.05)
        out.append((x, y))
    return out


def test_the_model_learns_the_pools_costs_and_its_error_falls() -> None:
    model, rng = LatencyModel(), random.Random(1)
    truth: Features = (0.02, 0.25, 0.04, 0.003)
    errors = [model.learn("p", x, y) for x, y in _samples(truth, 400, rng)]
    assert model.weights("p") == pytest.approx(truth, abs=0.01)
    late = sorted(errors[-100:])[50]  # the median relative error, once learnt
    assert late < 0.05 < 0.2 < errors[0]  # the prior's first guess was far off


def test_the_model_forgets_what_no_longer_holds() -> None:
    model, rng = LatencyModel(), random.Random(2)
    for x, y in _samples((0.02, 0.25, 0.04, 0.003), 400, rng):
        model.learn("p", x, y)
    slower: Features = (0.05, 0.6, 0.04, 0.003)  # the engines got 2.4x slower per prompt token
    for x, y in _samples(slower, 600, rng):
        model.learn("p", x, y)
    assert model.weights("p")[1] == pytest.approx(0.6, abs=0.03)
    assert model.weights("other") == PRIOR  # pools learn apart


def test_the_scorer_ranks_like_the_backlog_before_learning_then_by_what_it_learnt() -> None:
    service = EppService(load_policy_text(POLICY))
    a, b = service.datastore.endpoints("p")
    scorer = service.scheduler.profile.scorers[0].scorer
    assert isinstance(scorer, LatencyScorer)
    request = service.scheduling_request("p", "1", "m", {"prompt": "q" * 100}, {})
    a.load.prefill_tokens = 3_000
    assert scorer.score(request, [a, b]) == {A: 0.0, B: 1.0}
    # A is in fact far faster with work queued (its requests are few): taught by first tokens
    model: LatencyModel = scorer.model
    for _ in range(200):
        model.learn("p", (1.0, 3.0, 0.0, 1.0), 0.05)  # prompt-heavy, one request: fast
        model.learn("p", (1.0, 0.1, 0.0, 20.0), 0.9)  # little prompt, many requests: slow
    b.in_flight = 20
    assert scorer.score(request, [a, b])[A] == 1.0


def test_a_first_token_teaches_the_model_and_a_failed_request_teaches_nothing() -> None:
    service = EppService(load_policy_text(POLICY))
    a = service.datastore.endpoints("p")[0]
    model = service.handle.latency
    assert model is not None
    answered = service.dispatched(service.scheduling_request("p", "1", "m", {"prompt": "x"}, {}), a)
    failed = service.dispatched(service.scheduling_request("p", "2", "m", {"prompt": "y"}, {}), a)
    service.prefilled(answered)
    service.prefilled(answered)  # once
    service.finished(answered)
    service.finished(failed)
    histogram = service.metrics.registry.get_sample_value(
        "kvgate_epp_ttft_prediction_error_count", {"pool": "p"}
    )
    assert histogram == 1.0 and model.weights("p") != PRIOR


def test_no_latency_scorer_no_model_and_nothing_recorded() -> None:
    service = EppService(load_policy_text(POLICY.replace("latency-scorer", "queue-scorer")))
    a = service.datastore.endpoints("p")[0]
    dispatch = service.dispatched(service.scheduling_request("p", "1", "m", {"prompt": "x"}, {}), a)
    assert service.handle.latency is None and dispatch.features is None
