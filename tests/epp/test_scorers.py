"""Table tests for each scorer, as GIE's queue_test.go does."""

from __future__ import annotations

import pytest

from epp.framework import Endpoint
from epp.scheduling.scorers.kv_cache_utilization import KVCacheUtilizationScorer
from epp.scheduling.scorers.lora_affinity import LoraAffinityScorer, Params
from epp.scheduling.scorers.queue import QueueScorer
from epp.scheduling.scorers.running_requests import RunningRequestsScorer
from epp.scheduling.scorers.session_affinity import SessionAffinityScorer
from tests.epp.builders import make_endpoint, make_request

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        ((0, 0, 0), (1.0, 1.0, 1.0)),
        ((0, 5, 10), (1.0, 0.5, 0.0)),
        ((3, 3, 9), (1.0, 1.0, 0.0)),
        ((7,), (1.0,)),
    ],
)
def test_queue_scorer(queues: tuple[int, ...], expected: tuple[float, ...]) -> None:
    endpoints = [make_endpoint(a, queue=q) for a, q in zip((A, B, C), queues, strict=False)]
    scores = QueueScorer("q").score(make_request(), endpoints)
    assert [scores[e.address] for e in endpoints] == pytest.approx(list(expected))


@pytest.mark.parametrize(
    ("running", "expected"), [((1, 2, 3), (1.0, 0.5, 0.0)), ((4, 4, 4), (1, 1, 1))]
)
def test_running_requests_scorer(running: tuple[int, ...], expected: tuple[float, ...]) -> None:
    endpoints = [make_endpoint(a, running=r) for a, r in zip((A, B, C), running, strict=True)]
    scores = RunningRequestsScorer("r").score(make_request(), endpoints)
    assert [scores[e.address] for e in endpoints] == pytest.approx(list(expected))


@pytest.mark.parametrize(("kv", "expected"), [(0.0, 1.0), (0.25, 0.75), (1.0, 0.0)])
def test_kv_cache_utilization_scorer(kv: float, expected: float) -> None:
    scores = KVCacheUtilizationScorer("kv").score(make_request(), [make_endpoint(A, kv=kv)])
    assert scores[A] == pytest.approx(expected)


@pytest.mark.parametrize(
    ("endpoint", "lora", "expected"),
    [
        (make_endpoint(A, running_loras=("sql",), max_loras=2), "sql", 1.0),
        (make_endpoint(A, running_loras=("chat",), max_loras=2), "sql", 0.8),
        (
            make_endpoint(A, running_loras=("chat",), waiting_loras=("sql",), max_loras=2),
            "sql",
            0.6,
        ),
        (make_endpoint(A, running_loras=("chat", "x"), max_loras=2), "sql", 0.0),
        (make_endpoint(A, max_loras=0), "sql", 0.0),
        (make_endpoint(A, running_loras=("chat",), max_loras=1), None, 1.0),
    ],
)
def test_lora_affinity_scorer(endpoint: Endpoint, lora: str | None, expected: float) -> None:
    scorer = LoraAffinityScorer("lora", Params())
    assert scorer.score(make_request(lora=lora), [endpoint])[A] == expected


def test_session_affinity_follows_the_last_pick() -> None:
    scorer = SessionAffinityScorer.from_config("s", {"max_sessions": 2})
    a, b = make_endpoint(A), make_endpoint(B)
    request = make_request(session="user-1")
    assert scorer.score(request, [a, b]) == {A: 0.0, B: 0.0}
    scorer.on_pick(request, b)
    assert scorer.score(request, [a, b]) == {A: 0.0, B: 1.0}
    for other in ("u2", "u3"):
        scorer.on_pick(make_request(session=other), a)
    assert scorer.score(request, [a, b]) == {A: 0.0, B: 0.0}  # evicted (LRU of 2)
    assert scorer.score(make_request(), [a, b]) == {A: 0.0, B: 0.0}
