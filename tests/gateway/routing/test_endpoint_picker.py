"""Least-in-flight picking."""

from __future__ import annotations

from gateway.routing.endpoint_picker import LeastInFlightPicker, PickRequest, endpoint_states
from policies.loader import load_policy_text

POLICY = load_policy_text("""
pools: {a: {endpoints: [127.0.0.1:1, 127.0.0.1:2, 127.0.0.1:3]}}
routes: [{model: m, pool: a}]
""")
REQ = PickRequest("m", {}, {}, None)


def test_prefers_fewest_in_flight_and_honours_exclude() -> None:
    pools = endpoint_states(POLICY)
    first, second, third = pools["a"]
    first.in_flight, second.in_flight, third.in_flight = 3, 1, 2
    picker = LeastInFlightPicker(pools, seed=1)
    assert picker.rank("a", REQ).next(set()) is second
    assert picker.rank("a", REQ).next({second.address}) is third
    assert picker.rank("a", REQ).next({e.address for e in pools["a"]}) is None
    assert picker.rank("missing", REQ).next(set()) is None


def test_ties_spread_over_endpoints() -> None:
    picker = LeastInFlightPicker(endpoint_states(POLICY), seed=7)
    picked = {(picker.rank("a", REQ).next(set())).address for _ in range(50)}  # type: ignore[union-attr]
    assert len(picked) == 3


def test_the_embedded_picker_counts_a_prompt_as_its_precise_index_tokenizes_it() -> None:
    from gateway.routing.embedded_epp import EmbeddedEpp
    from kvgate.wire.request_tokenizer import ReferenceTokenizer

    precise = load_policy_text("""
pools: {p: {endpoints: [127.0.0.1:1]}}
routes: [{model: m, pool: p}]
epp:
  plugins:
    - {name: prefix, type: prefix-cache-scorer, params: {mode: precise}}
    - {name: pick, type: max-score-picker}
  profiles: [{name: default, plugins: [{ref: prefix}, {ref: pick}]}]
""")
    picker = EmbeddedEpp(precise, endpoint_states(precise))
    messages = [{"role": "user", "content": "長い質問"}]
    request = PickRequest("m", {"model": "m", "messages": messages}, {}, None)
    ids = picker.prompt_token_ids("p", request)
    assert ids == ReferenceTokenizer().chat_ids(messages)  # what the engine computes
    assert request.worked_out is not None  # the ranking reuses what was worked out...
    picker.rank("p", request)
    assert [request.worked_out] == [None]  # ... once
    approximate = EmbeddedEpp(POLICY, endpoint_states(POLICY))
    assert approximate.prompt_token_ids("p", request) is None  # no tokenizer known
