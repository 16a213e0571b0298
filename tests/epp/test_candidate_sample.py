"""Large pools are scored on a sample: the endpoints holding the prompt, the session's home,
and a random rest (``epp.sample_candidates``)."""

from __future__ import annotations

import time

import pytest

from epp.framework import SchedulingRequest
from epp.service import EppService
from policies.errors import PolicyError
from policies.loader import load_policy_text
from policies.schema import SAMPLE_CANDIDATES

PROMPT = "the system prompt of one assistant, shared by many calls " * 20


def policy(endpoints: int, epp: str = "", roles: dict[int, str] | None = None) -> str:
    items = [
        f"{{address: '127.0.{i // 250}.{i % 250 + 1}:8000', role: {(roles or {}).get(i, 'both')}}}"
        for i in range(endpoints)
    ]
    return (
        f"pools: {{p: {{endpoints: [{', '.join(items)}]}}}}\nroutes: [{{model: m, pool: p}}]\n{epp}"
    )


def service_of(text: str) -> EppService:
    service = EppService(load_policy_text(text))
    now = time.monotonic()
    for endpoint in service.datastore.all():
        m = endpoint.metrics
        m.scraped_at, m.block_size, m.num_gpu_blocks = now + 3600, 16, 4096
    return service


def chat(text: str, rid: str, **fields: object) -> SchedulingRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], **fields}
    return SchedulingRequest(rid, "m", text, body=body)


def scored(service: EppService, request: SchedulingRequest) -> set[str]:
    """The endpoints the pick scored."""
    return set(service.pick("p", request).result.scores)


SIZE = SAMPLE_CANDIDATES


def test_a_pool_no_larger_than_the_sample_is_scored_whole() -> None:
    service = service_of(policy(SIZE))
    assert len(scored(service, chat(PROMPT, "a"))) == SIZE


def test_a_large_pool_is_scored_on_a_sample_that_keeps_the_prompts_holder() -> None:
    service = service_of(policy(1000))
    first = chat(PROMPT + "first question", "a")
    home = service.pick("p", first).result.target
    assert home is not None
    service.finished(service.dispatched(first, home))  # answered: no backlog there
    for n in range(20):  # every sample holds it, and the pick stays there
        again = chat(PROMPT + f"question {n}", f"b{n}")
        candidates = scored(service, again)
        assert len(candidates) <= SIZE + 1 and home.address in candidates
        assert service.pick("p", again).result.target is home


def test_samples_differ_from_pick_to_pick() -> None:
    service = service_of(policy(1000))
    seen = set().union(
        *(scored(service, chat(f"cold prompt {n} " * 40, str(n))) for n in range(40))
    )
    assert len(seen) > 10 * SIZE


def test_the_sessions_home_is_in_every_sample() -> None:
    service = service_of(policy(1000))
    first = chat("hello", "a", prompt_cache_key="session-1")
    home = service.pick("p", first).result.target
    assert home is not None
    service.dispatched(first, home)
    for n in range(20):
        assert home.address in scored(
            service, chat(f"other words {n}", str(n), prompt_cache_key="session-1")
        )


def test_zero_scores_every_endpoint_and_a_lora_request_is_never_sampled() -> None:
    whole = service_of(policy(200, "epp: {sample_candidates: 0}"))
    assert len(scored(whole, chat(PROMPT, "a"))) == 200
    text = policy(200).replace("pool: p}", "pool: p}, {model: lora-a, pool: p}")
    text = text.replace("{p: {endpoints", "{p: {adapters: [lora-a], endpoints")
    lora = service_of(text)
    request = SchedulingRequest("a", "lora-a", PROMPT, lora="lora-a", body={"prompt": PROMPT})
    assert len(scored(lora, request)) == 200


def test_a_sample_the_filters_empty_falls_back_to_the_whole_pool() -> None:
    epp = (
        "epp: {plugins: [{name: d, type: decode-filter}, {name: q, type: queue-scorer}, "
        "{name: pick, type: max-score-picker}], "
        "profiles: [{name: default, plugins: [{ref: d}, {ref: q}, {ref: pick}]}]}"
    )
    roles = {i: "prefill" for i in range(300)} | {271: "decode"}
    service = service_of(policy(300, epp, roles))
    for n in range(10):
        target = service.pick("p", chat(f"prompt {n}", str(n))).result.target
        assert target is not None and target.spec.role == "decode"


def test_the_size_must_not_be_negative() -> None:
    with pytest.raises(PolicyError, match="sample_candidates"):
        load_policy_text(policy(2, "epp: {sample_candidates: -1}"))
