"""Tokens in flight per endpoint (the picker's own count) and the scorer that reads them."""

from __future__ import annotations

from epp.service import DEFAULT_OUTPUT_TOKENS, EppService
from policies.loader import load_policy_text

A, B = "10.0.0.1:8000", "10.0.0.2:8000"
POLICY = f"""
pools: {{p: {{endpoints: [{A}, {B}]}}}}
routes: [{{model: m, pool: p}}]
epp:
  plugins:
    - {{name: prefix, type: prefix-cache-scorer, params: {{chars_per_token: 1}}}}
    - {{name: load, type: token-backlog-scorer}}
    - {{name: pick, type: max-score-picker}}
  profiles: [{{name: default, plugins: [{{ref: load}}, {{ref: pick}}]}}]
"""
PROMPT = "p" * 2_000  # 2,000 tokens at one character per token


def test_a_dispatch_counts_its_uncached_prompt_until_the_first_token_and_its_output_until_done() -> (
    None
):
    service = EppService(load_policy_text(POLICY))
    a = service.datastore.endpoints("p")[0]
    first = service.scheduling_request("p", "1", "m", {"prompt": PROMPT, "max_tokens": 32}, {})
    one = service.dispatched(first, a)
    assert (a.load.prefill_tokens, a.load.decode_tokens) == (2_000, 32)
    again = service.scheduling_request("p", "2", "m", {"prompt": PROMPT + "q" * 50}, {})
    two = service.dispatched(again, a)  # the prompt is held there now: only its tail counts
    assert a.load.prefill_tokens - 2_000 < 120
    assert a.load.decode_tokens == 32 + DEFAULT_OUTPUT_TOKENS
    service.prefilled(one)
    service.prefilled(one)  # idempotent
    assert a.load.prefill_tokens == two.prefill_tokens
    service.finished(one)
    service.finished(two)
    assert (a.load.prefill_tokens, a.load.decode_tokens) == (0, 0)


def test_a_request_stays_with_its_cache_until_the_backlog_there_outweighs_a_miss() -> None:
    service = EppService(load_policy_text(POLICY))
    a, b = service.datastore.endpoints("p")
    warm = service.scheduling_request("p", "w", "m", {"prompt": PROMPT}, {})
    service.finished(service.dispatched(warm, a))  # A holds the prompt, nothing in flight
    ask = {"prompt": PROMPT + " and a question", "max_tokens": 16}
    assert service.pick("p", service.scheduling_request("p", "1", "m", ask, {})).result.target is a
    a.load.prefill_tokens = 1_500  # less than the 2,000 a miss on B would compute
    assert service.pick("p", service.scheduling_request("p", "2", "m", ask, {})).result.target is a
    a.load.prefill_tokens = 2_500  # more: B computes the whole prompt sooner than A gets to it
    assert service.pick("p", service.scheduling_request("p", "3", "m", ask, {})).result.target is b
