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


def test_the_overload_rows_load_with_their_classes_keys_slots_and_scorer() -> None:
    from bench.overload import KEYS, peers

    rows = {p.name: p for p in peers(slots=6, backends=len(BACKENDS))}
    classes = load_policy_text(kvgate_policy(rows["kvgate (classes)"], BACKENDS, "m"))
    assert classes.pools["p"].max_concurrency == 12
    assert classes.classes["batch"].max_pauses == 2 and classes.classes["interactive"].deadline == 2
    assert len(classes.auth.api_keys) == len(KEYS)
    latency = load_policy_text(kvgate_policy(rows["kvgate (latency scorer)"], BACKENDS, "m"))
    types = [p.type for p in latency.epp.plugins]
    assert "latency-scorer" in types and "token-backlog-scorer" not in types
    assert not latency.auth.api_keys  # no classes: every key is ignored


def test_the_overload_traffic_has_three_classes_and_long_batch_prompts() -> None:
    from bench.overload import classed
    from loadtest.workloads.chats import shared_prefix

    chains = classed(shared_prefix(4, 100, 200, 0), 0, long_prompts=False)
    names = [chain[0].group.split("|")[0] for chain in chains]
    shares = {name: names.count(name) / len(names) for name in set(names)}
    assert shares["interactive"] < shares["batch"] < shares["standard"]
    batch = next(c[0] for c in chains if c[0].group.startswith("batch|"))
    other = next(c[0] for c in chains if c[0].group.startswith("standard|"))
    assert len(str(batch.messages)) > len(str(other.messages)) + 2000
    assert batch.max_tokens == 128 and batch.headers["Authorization"] == "Bearer sk-bench-batch"
