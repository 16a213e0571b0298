"""The policies ``make bench-routing`` gives kvgate load, and precise mode is the shipped
example's: the default profile with a precise index."""

from __future__ import annotations

from bench.routing_peers import PEERS, Backend, kvgate_policy
from policies.loader import load_policy_text

BACKENDS = [Backend(9000, 9001), Backend(9002, 9003)]


def test_precise_is_the_default_profile_with_a_precise_index() -> None:
    by_name = {p.policy: p for p in PEERS if p.router == "kvgate"}
    default = load_policy_text(kvgate_policy(by_name["default"], BACKENDS, "m")).epp
    precise = load_policy_text(kvgate_policy(by_name["precise"], BACKENDS, "m")).epp
    plugins = {p.name: p for p in precise.plugins}
    assert plugins["prefix"].params == {"mode": "precise", "block_size_tokens": 16}
    assert [(p.name, p.type) for p in precise.plugins] == [
        (p.name, p.type) for p in default.plugins
    ]
    assert precise.profiles == default.profiles


def test_a_lora_mix_routes_every_adapter_to_the_pool_that_serves_it() -> None:
    adapters = ("lora-0", "lora-1")
    policy = load_policy_text(kvgate_policy(PEERS[0], BACKENDS, "m", adapters))
    assert policy.pools["p"].adapters == adapters
    assert [r.model for r in policy.routes] == ["m", *adapters]
    assert {r.pool for r in policy.routes} == {"p"}
