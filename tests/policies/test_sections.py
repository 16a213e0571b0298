"""The policy loader, section by section: a YAML fragment and the exact errors it gets, each
naming the field path and line."""

from __future__ import annotations

import pytest

from epp.scheduling.registry import CATALOG
from policies.errors import PolicyError
from policies.loader import load_policy_text

POOLS = "pools:\n  a: {endpoints: [127.0.0.1:8001]}\n"
ROUTES = "routes:\n  - {model: m, pool: a}\n"


def errors_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as err:
        load_policy_text(text, plugins=CATALOG)
    return err.value.errors


def with_base(fragment: str) -> str:
    """``fragment`` at line 5, after the pools and routes every policy needs."""
    return POOLS + ROUTES + fragment


CASES = [
    # top level and YAML itself
    ("version", with_base("version: 2"), ["version (line 5): must be at most 1; got 2"]),
    (
        "unknown section",
        with_base("colour: blue"),
        [
            "colour (line 5): unknown field (expected one of: auth, breakers, classes, cors, epp,"
            " limits, listen, models, observability, pools, response_cache, retries, routes, slos,"
            " spend, state_dir, tenants, timeouts, version)"
        ],
    ),
    ("duplicate key", with_base(ROUTES), ["routes (line 5): duplicate key"]),
    ("non-string key", with_base("[1]: x"), ["<root> (line 5): keys must be strings"]),
    # listen
    (
        "listen.workers",
        with_base("listen: {workers: 0}"),
        ["listen.workers (line 5): must be at least 1; got 0"],
    ),
    (
        "listen.admin",
        with_base("listen: {admin: {port: 0, token: short}}"),
        ["listen.admin.token (line 5): is required, at least 16 characters (use ${ENV_VAR})"],
    ),
    (
        "listen.admin.keys",
        with_base(
            "listen: {admin: {port: 0, token: 0123456789abcdef, keys: ["
            "{name: a, token: short, role: viewer}, {name: b, token: 0123456789abcdef, role: root}"
            "]}}"
        ),
        [
            "listen.admin.keys[0].token (line 5): is required, at least 16 characters (use"
            " ${ENV_VAR})",
            "listen.admin.keys[1].role (line 5): must be one of viewer, operator, admin; got"
            " 'root'",
            "listen.admin.keys (line 5): two keys share a token: each caller needs its own",
        ],
    ),
    (
        "listen.admin.keys names",
        with_base(
            "listen: {admin: {port: 0, token: 0123456789abcdef, keys: ["
            "{name: admin, token: 0123456789abcdeX, role: viewer}]}}"
        ),
        ["listen.admin.keys (line 5): two keys share a name ('admin' is the token's)"],
    ),
    # auth and tenants
    (
        "auth.allow_anonymous",
        with_base("auth: {allow_anonymous: maybe}"),
        ["auth.allow_anonymous (line 5): must be true or false; got 'maybe'"],
    ),
    (
        "tenants.class",
        with_base("tenants: {t: {class: vip}}"),
        ["tenants.t.class (line 5): unknown class 'vip'"],
    ),
    # pools
    (
        "pools.endpoints.address",
        "pools:\n  a: {endpoints: [nohost]}\n" + ROUTES,
        ["pools.a.endpoints[0].address (line 2): must be host:port; got 'nohost'"],
    ),
    (
        "pools.endpoints.role",
        "pools:\n  a: {endpoints: [{address: 127.0.0.1:9, role: middle}]}\n" + ROUTES,
        ["pools.a.endpoints[0].role (line 2): must be one of both, prefill, decode; got 'middle'"],
    ),
    (
        "pools.endpoints twice",
        "pools:\n  a: {endpoints: [127.0.0.1:9, 127.0.0.1:9]}\n" + ROUTES,
        ["pools.a.endpoints (line 2): endpoint 127.0.0.1:9 is listed twice"],
    ),
    (
        "pools.engine",
        "pools:\n  a: {engine: tgi, endpoints: [127.0.0.1:9]}\n" + ROUTES,
        ["pools.a.engine (line 2): must be one of vllm, sglang, kvgate; got 'tgi'"],
    ),
    (
        "pools.pd",
        "pools:\n  a: {endpoints: [127.0.0.1:9], pd: {min_uncached_tokens: -1}}\n" + ROUTES,
        ["pools.a.pd.min_uncached_tokens (line 2): must be at least 0; got -1"],
    ),
    # routes
    (
        "routes.pool",
        POOLS + "routes:\n  - {model: x, pool: nope}\n",
        ["routes[0].pool (line 4): unknown pool 'nope' (pools: a)"],
    ),
    (
        "routes: pool and canary",
        POOLS + "routes:\n  - {model: x, pool: a, canary: [{pool: a, weight: 1}]}\n",
        ["routes[0] (line 4): needs exactly one of pool, canary, ab_test"],
    ),
    (
        "routes.canary weights",
        POOLS + "routes:\n  - {model: x, canary: [{pool: a, weight: 0}]}\n",
        ["routes[0].canary (line 4): weights must not all be zero"],
    ),
    (
        "routes.ab_test",
        POOLS
        + "routes:\n  - {model: x, ab_test: {name: t, key: cookie, arms: [{pool: a, weight: 1}]}}\n",
        [
            "routes[0].ab_test.key (line 4): must be 'user' or 'header:<name>'",
            "routes[0].ab_test.arms (line 4): weights are basis points and must sum to 10000; got 1",
        ],
    ),
    (
        "routes.shadow",
        POOLS + "routes:\n  - {model: x, pool: a, shadow: {pool: a, sample: 2}}\n",
        ["routes[0].shadow.sample (line 4): must be at most 1.0; got 2.0"],
    ),
    (
        "routes.fallback",
        POOLS + "routes:\n  - {model: x, pool: a, fallback: [ghost]}\n",
        ["routes[0].fallback (line 4): 'ghost' is not another routed model"],
    ),
    # timeouts, retries, breakers
    (
        "timeouts",
        with_base("timeouts: {connect: -1s}"),
        ["timeouts.connect (line 5): must be a duration like 500ms or 5s; got '-1s'"],
    ),
    (
        "retries.attempts",
        with_base("retries: {attempts: 11}"),
        ["retries.attempts (line 5): must be at most 10; got 11"],
    ),
    (
        "retries.budget_ratio",
        with_base("retries: {budget_ratio: -1}"),
        ["retries.budget_ratio (line 5): must be at least 0.0; got -1.0"],
    ),
    (
        "breakers.failure_ratio",
        with_base("breakers: {failure_ratio: 1.5}"),
        ["breakers.failure_ratio (line 5): must be at most 1.0; got 1.5"],
    ),
    # limits
    (
        "limits.store.url",
        with_base("limits: {store: {kind: redis}}"),
        ["limits.store.url (line 5): is required for the redis store (redis://host:port/db)"],
    ),
    (
        "limits.store.kind",
        with_base("limits: {store: {kind: disk}}"),
        ["limits.store.kind (line 5): must be one of memory, redis; got 'disk'"],
    ),
    (
        "limits.rules amount",
        with_base("limits: {rules: [{match: {tenant: acme}}]}"),
        ["limits.rules[0] (line 5): needs requests_per_min or tokens_per_min"],
    ),
    (
        "limits.rules.match",
        with_base("limits: {rules: [{match: {planet: mars}, requests_per_min: 1}]}"),
        [
            "limits.rules[0].match.planet (line 5): unknown field (expected one of: api_key, model, route, tenant)"
        ],
    ),
    # observability
    (
        "observability.tracing.exporter",
        with_base("observability: {tracing: {exporter: zipkin}}"),
        [
            "observability.tracing.exporter (line 5): must be one of none, console, otlp; got 'zipkin'"
        ],
    ),
    # epp
    (
        "epp.scrape_interval",
        with_base("epp: {scrape_interval: never}"),
        ["epp.scrape_interval (line 5): must be a duration like 500ms or 5s; got 'never'"],
    ),
    (
        "epp.plugins name twice",
        with_base("epp: {plugins: [{name: q, type: queue-scorer}, {name: q, type: queue-scorer}]}"),
        ["epp.plugins[1].name (line 5): plugin name 'q' is used twice"],
    ),
    (
        "epp.plugins params",
        with_base("epp: {plugins: [{name: p, type: prefix-cache-scorer, params: {mode: x}}]}"),
        ["epp.plugins[0].params (line 5): p.mode: value 'x' is out of range"],
    ),
    (
        "epp.plugins saturation thresholds moved",
        with_base("epp: {plugins: [{name: s, type: saturation-filter, params: {kv_usage: 2}}]}"),
        [
            "epp.plugins[0].params (line 5): s.kv_usage: saturation thresholds are set once, "
            "in epp.saturation.kv_usage"
        ],
    ),
    (
        "epp.saturation",
        with_base("epp: {saturation: {queue_depth: 0, kv_usage: 2, max_metrics_age: x}}"),
        [
            "epp.saturation.queue_depth (line 5): must be at least 1; got 0",
            "epp.saturation.kv_usage (line 5): must be at most 1.0; got 2.0",
            "epp.saturation.max_metrics_age (line 5): must be a duration like 500ms or 5s; got 'x'",
        ],
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_section_errors(text: str, expected: list[str]) -> None:
    assert errors_of(text) == expected


def test_without_a_catalog_plugin_types_are_left_to_the_epp() -> None:
    """A loader that is not given the EPP's catalog checks only the section's structure."""
    text = with_base("epp: {plugins: [{name: s, type: nope-filter}]}")
    assert load_policy_text(text).epp.plugins[0].type == "nope-filter"
    assert errors_of(text)[0].startswith("epp.plugins[0].type (line 5): unknown plugin type")


def test_a_route_says_who_may_read_its_decisions() -> None:
    policy = load_policy_text(
        POOLS + "routes:\n  - {model: m, pool: a, explain: {tenants: [ops], sample: 0.01}}\n"
    )
    explain = policy.routes[0].explain
    assert explain is not None and explain.allows("ops") and not explain.allows("app")
    assert explain.sample == 0.01
    assert errors_of(POOLS + "routes:\n  - {model: m, pool: a, explain: {sample: 2}}\n") == [
        "routes[0].explain.sample (line 4): must be at most 1.0; got 2.0"
    ]


def test_a_pool_names_the_adapters_the_gateway_loads_and_how_many_fit() -> None:
    policy = load_policy_text(
        "pools:\n  a: {endpoints: [127.0.0.1:8001], adapters: {sql: /m/sql, chat: /m/chat},"
        " max_adapters: 2}\n" + ROUTES
    )
    pool = policy.pools["a"]
    assert pool.adapters == ("sql", "chat") and pool.max_adapters == 2
    assert pool.adapter_paths == {"sql": "/m/sql", "chat": "/m/chat"}
    listed = load_policy_text(
        "pools:\n  a: {endpoints: [127.0.0.1:8001], adapters: [sql]}\n" + ROUTES
    )
    assert listed.pools["a"].adapters == ("sql",) and not listed.pools["a"].adapter_paths
    assert errors_of(
        "pools:\n  a: {endpoints: [127.0.0.1:8001], adapters: {sql: 3}, max_adapters: 0}\n" + ROUTES
    ) == [
        "pools.a.adapters.sql (line 2): must be the path the engines load it from",
        "pools.a.max_adapters (line 2): must be at least 1; got 0",
    ]


def test_a_pool_asks_its_engines_to_keep_agents_blocks_through_tool_pauses() -> None:
    policy = load_policy_text(
        "pools:\n  a: {endpoints: [127.0.0.1:8001], kv_retention: 45s}\n" + ROUTES
    )
    assert policy.pools["a"].kv_retention == 45.0
    assert load_policy_text(POOLS + ROUTES).pools["a"].kv_retention == 0.0  # off by default
    assert errors_of(
        "pools:\n  a: {endpoints: [127.0.0.1:8001], kv_retention: 10m}\n" + ROUTES
    ) == ["pools.a.kv_retention (line 2): must be at most 300s (engines cap it)"]


def test_tokenized_prompts_need_the_precise_index_that_makes_the_ids() -> None:
    pools = "pools:\n  a: {endpoints: [127.0.0.1:8001], tokenized_prompts: true}\n"
    assert errors_of(pools + ROUTES) == [
        "pools.a.tokenized_prompts (line 2): needs the precise prefix index (a prefix-cache-scorer "
        "with "
        "mode: precise), whose tokenizer makes the ids"
    ]
    precise = """
epp:
  plugins:
    - {name: prefix, type: prefix-cache-scorer, params: {mode: precise}}
    - {name: pick, type: max-score-picker}
  profiles: [{name: default, plugins: [{ref: prefix}, {ref: pick}]}]
"""
    assert load_policy_text(pools + ROUTES + precise).pools["a"].tokenized_prompts
    assert not load_policy_text(POOLS + ROUTES).pools["a"].tokenized_prompts  # off by default
