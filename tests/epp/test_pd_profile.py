"""The PD profile: a decode pick, plus a prefill pick when the uncached prompt is long enough."""

from __future__ import annotations

import dataclasses
import time

from epp.framework import Endpoint, SchedulingRequest, SchedulingResult
from epp.service import EppService
from policies.loader import load_policy_text

POLICY = """
pools:
  pd:
    pd: {min_uncached_tokens: 64}
    endpoints:
      - {address: 127.0.0.2:1, role: prefill}
      - {address: 127.0.0.2:2, role: decode}
      - {address: 127.0.0.2:3, role: decode}
routes: [{model: m, pool: pd}]
"""


def request(text: str, rid: str) -> SchedulingRequest:
    return SchedulingRequest(rid, "m", text, body={"prompt": text})


def pick_pd(
    service: EppService, scheduling: SchedulingRequest
) -> tuple[SchedulingResult, Endpoint | None]:
    """The pool's decision; every endpoint chosen accepts the request."""
    decision = service.pick("pd", scheduling)
    for endpoint in decision.chosen:
        service.dispatched(scheduling, endpoint)
    return decision.result, decision.prefill


def scraped(service: EppService, prefill_queue: int = 0) -> EppService:
    """Every endpoint freshly scraped (stale metrics count as saturated), the prefill
    endpoints with ``prefill_queue`` requests waiting."""
    for endpoint in service.datastore.all():
        queue = prefill_queue if endpoint.spec.role == "prefill" else 0
        endpoint.metrics = dataclasses.replace(
            endpoint.metrics, scraped_at=time.monotonic(), waiting=queue
        )
    return service


def test_long_uncached_prompt_gets_a_prefill_endpoint() -> None:
    service = scraped(EppService(load_policy_text(POLICY)))
    long_prompt = "a distinct long prompt " * 40  # ~230 tokens at 4 chars per token
    first = request(long_prompt, "r1")
    decision = service.pick("pd", first)
    decode, prefill = decision.result, decision.prefill
    assert decode.target is not None and decode.target.spec.role == "decode"
    assert prefill is not None and prefill.spec.role == "prefill"
    for endpoint in decision.chosen:
        service.finished(service.dispatched(first, endpoint))
    # the same prompt again, the first answer over: the decode endpoint holds it, nothing long
    # is left to compute
    again, prefill_again = pick_pd(service, request(long_prompt + " more", "r2"))
    assert again.target is decode.target and prefill_again is None


def test_a_saturated_prefill_pool_means_the_decode_endpoint_prefills() -> None:
    long_prompt = "a distinct long prompt " * 40
    service = scraped(EppService(load_policy_text(POLICY)), prefill_queue=1000)
    decode, prefill = pick_pd(service, request(long_prompt, "r1"))
    assert decode.target is not None and prefill is None
    never_scraped = EppService(load_policy_text(POLICY))  # stale metrics: saturated too
    assert pick_pd(never_scraped, request(long_prompt, "r1"))[1] is None


def test_a_prefill_endpoint_busy_with_its_limit_of_hops_is_not_chosen() -> None:
    limited = POLICY.replace(
        "pd: {min_uncached_tokens: 64}", "pd: {min_uncached_tokens: 64, max_prefill_in_flight: 1}"
    )
    service = scraped(EppService(load_policy_text(limited)))
    _, first = pick_pd(service, request("a distinct long prompt " * 40, "r1"))
    assert first is not None and first.in_flight == 1  # its prefill hop is in flight
    _, second = pick_pd(service, request("another distinct long prompt " * 40, "r2"))
    assert second is None  # it would queue behind the first: the decode endpoint prefills
    first.in_flight -= 1  # the first hop is over
    _, third = pick_pd(service, request("a third distinct long prompt " * 40, "r3"))
    assert third is first


def test_short_prompt_or_no_pd_config_means_decode_only() -> None:
    service = scraped(EppService(load_policy_text(POLICY)))
    decode, prefill = pick_pd(service, request("short", "r1"))
    assert decode.target is not None and decode.target.spec.role == "decode" and prefill is None
    plain = EppService(
        load_policy_text(POLICY.replace("pd: {min_uncached_tokens: 64}", "model: x"))
    )
    assert pick_pd(plain, request("a distinct long prompt " * 40, "r1"))[1] is None


def test_uncached_estimate_covers_prompts_longer_than_the_hashed_prefix() -> None:
    service = EppService(load_policy_text(POLICY))
    huge = "x" * 80_000  # ~20,000 tokens; only the first 16,384 characters are hashed
    scheduling = service.scheduling_request("pd", "r1", "m", {"prompt": huge}, {})
    assert len(scheduling.routing_text) == 16_384
    target = service.datastore.endpoints("pd")[1]
    assert service.prefix is not None
    assert service.prefix.uncached_tokens(scheduling, target) == 20_000


def test_nothing_is_rendered_when_no_approximate_index_reads_it() -> None:
    precise = (
        POLICY
        + """epp:
  plugins:
    - {name: prefix, type: prefix-cache-scorer, params: {mode: precise}}
    - {name: pick, type: max-score-picker}
  profiles: [{name: default, plugins: [{ref: prefix}, {ref: pick}]}]
"""
    )
    service = EppService(load_policy_text(precise))
    assert service.scheduling_request("pd", "r", "m", {"prompt": "x" * 1000}, {}).routing_text == ""
