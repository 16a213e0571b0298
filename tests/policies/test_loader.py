"""Policy loading: examples load, every error names its field path and line, all at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.scheduling.registry import CATALOG
from kvgate.cli import main
from policies.errors import PolicyError
from policies.loader import load_policy, load_policy_text
from policies.schema import Replicas

EXAMPLES = sorted((Path(__file__).parents[2] / "policies" / "examples").glob("*.yaml"))
BASE = """
pools:
  a: {endpoints: [127.0.0.1:8001]}
routes:
  - {model: m, pool: a}
"""


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_load(path: Path) -> None:
    policy = load_policy(path, plugins=CATALOG)
    assert policy.routes and policy.pools


def test_defaults() -> None:
    policy = load_policy_text(BASE)
    assert policy.listen.port == 8080 and policy.listen.workers == 1
    assert policy.listen.header_timeout == 30.0
    assert load_policy_text(BASE + "listen: {header_timeout: 5s}").listen.header_timeout == 5.0
    assert policy.listen.trusted_proxies == () and policy.cors is None
    trusted = load_policy_text(BASE + "listen: {trusted_proxies: [10.0.0.0/8, '::1']}")
    assert trusted.listen.trusted_proxies == ("10.0.0.0/8", "::1")
    assert policy.auth.allow_anonymous
    assert policy.timeouts.first_byte == 60.0
    assert policy.route_for("m") is not None and policy.route_for("x") is None


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("listen: {port: 70000}", "listen.port (line 6): must be at most 65535; got 70000"),
        ("listen: {wrkers: 2}", "listen.wrkers (line 6): unknown field"),
        ("timeouts: {idle: soon}", "timeouts.idle (line 6): must be a duration"),
        ("listen: {header_timeout: slow}", "listen.header_timeout (line 6): must be a duration"),
        ("listen: {max_body: lots}", "listen.max_body (line 6): must be a size"),
        ("cors: {credentials: true}", "cors.origins (line 6): is required"),
        (
            "routes: [{model: m2, pool: p, paths: [tokenize]}]",
            "routes[0].paths[0] (line 6): 'tokenize' is not an extra path",
        ),
        (
            "routes: [{model: m2, pool: p, paths: [/v1/completions]}]",
            "routes[0].paths[0] (line 6): '/v1/completions' is not an extra path",
        ),
        (
            "epp: {objectives: {batch: {priority: low}}}",
            "epp.objectives.batch.priority (line 6): must be",
        ),
        (
            "auth: {jwt: [{issuer: i, algorithms: [RS256], jwks_url: 'ftp://idp/keys'}]}",
            "auth.jwt[0].jwks_url (line 6): must be an http:// or https:// URL",
        ),
        (
            "auth: {jwt: [{issuer: i, algorithms: [RS256], jwks_url: 'https://idp/k', jwks_file: x}]}",
            "needs exactly one of jwks_file and jwks_url",
        ),
        (
            "auth: {jwt: [{issuer: i, algorithms: [RS256]}]}",
            "needs exactly one of jwks_file and jwks_url",
        ),
        (
            "observability: {metrics: {token: short}}",
            "observability.metrics.token (line 6): must be at least 16 characters",
        ),
        (
            "listen: {port: 9000, admin: {port: 9000, token: 0123456789abcdef}}",
            "listen.admin.port (line 6): must differ from listen.port",
        ),
        ("cors: {origins: [app.example.com]}", "cors.origins[0] (line 6): 'app.example.com'"),
        ("cors: {origins: ['*'], credentials: true}", "cors.credentials (line 6): cannot be"),
        (
            "listen: {trusted_proxies: [10.0.0.0/8, proxy.local]}",
            "listen.trusted_proxies[1] (line 6): 'proxy.local' is not an address or network",
        ),
        ("observability: {access_log: xml}", "observability.access_log (line 6): must be one of"),
        ("auth: {api_keys: [{sha256: abc, tenant: t}]}", "auth.api_keys[0].sha256 (line 6)"),
        ("auth: {jwt: [{issuer: i, jwks_file: /missing.json}]}", "auth.jwt[0].algorithms"),
        (
            "auth: {jwt: [{issuer: i, jwks_file: /missing.json, algorithms: [RS256]}]}",
            "auth.jwt[0].jwks_file (line 6): cannot read a JWKS",
        ),
        ("auth: {jwt: [{issuer: i, jwks_file: x, algorithms: [HS256, RS256]}]}", "do not mix"),
        (
            "auth: {jwt: [{issuer: i, jwks_file: x, algorithms: [none]}]}",
            "unsupported algorithm 'none'",
        ),
        (
            "secret: ${KVGATE_TEST_UNSET_VAR}",
            "secret (line 6): environment variable KVGATE_TEST_UNSET_VAR",
        ),
    ],
)
def test_field_errors_name_path_and_line(extra: str, expected: str) -> None:
    with pytest.raises(PolicyError) as err:
        load_policy_text(BASE + extra)
    assert any(expected in e for e in err.value.errors), err.value.errors


def test_cross_references_and_all_errors_at_once() -> None:
    text = """
pools:
  a: {endpoints: [bad-address, 1.2.3.4:80, 1.2.3.4:80]}
routes:
  - {model: m, pool: a}
  - {model: m, pool: gpu-b}
tenants: {acme: {}}
auth: {api_keys: [{sha256: %s, tenant: other}]}
""" % ("a" * 64)
    with pytest.raises(PolicyError) as err:
        load_policy_text(text)
    errors = "\n".join(err.value.errors)
    assert "routes[1].pool (line 6): unknown pool 'gpu-b' (pools: a)" in errors
    assert "routes[1].model (line 6): model 'm' is routed twice" in errors
    assert "pools.a.endpoints[0].address (line 3): must be host:port" in errors
    assert "endpoint 1.2.3.4:80 is listed twice" in errors
    assert "auth.api_keys[0].tenant (line 8): unknown tenant 'other'" in errors
    assert len(err.value.errors) == 5


def test_missing_sections_and_yaml_syntax() -> None:
    with pytest.raises(PolicyError) as err:
        load_policy_text("version: 1\n")
    assert any("pools" in e for e in err.value.errors)
    assert any("routes" in e for e in err.value.errors)
    with pytest.raises(PolicyError) as err:
        load_policy_text("pools: [a\n")
    assert err.value.errors[0].startswith("invalid YAML (line 2)")


def test_env_interpolation_with_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_TEST_KEY", "s3cret")
    text = BASE.replace(
        "{endpoints:", "{api_key: '${KVGATE_TEST_KEY}', model: '${MODEL_X:-llama}', endpoints:"
    )
    policy = load_policy_text(text)
    assert policy.pools["a"].api_key == "s3cret"
    assert policy.pools["a"].model == "llama"


def test_yaml_off_means_access_log_off() -> None:
    assert (
        load_policy_text(BASE + "observability: {access_log: off}").observability.access_log
        == "off"
    )


def test_policy_check_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(BASE)
    assert main(["policy", "check", str(good)]) == 0
    assert "OK" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE + "listen: {port: -1}\n")
    assert main(["policy", "check", str(bad)]) == 1
    assert "listen.port (line 6): must be at least 0" in capsys.readouterr().err
    assert main(["policy", "check", str(tmp_path / "absent.yaml")]) == 1


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("epp: {picker: magic}", "epp.picker (line 6): must be one of epp, least-in-flight"),
        (
            "epp: {plugins: [{name: a, type: nope-scorer}]}",
            "epp.plugins[0].type (line 6): unknown plugin type",
        ),
        (
            "epp: {plugins: [{name: a, type: queue-scorer, params: {x: 1}}]}",
            "epp.plugins[0].params (line 6): a: unknown param",
        ),
        (
            "epp: {plugins: [{name: q, type: queue-scorer}, {name: p, type: max-score-picker}],"
            " profiles: [{name: d, plugins: [{ref: q}, {ref: missing}, {ref: p, weight: 2}]}]}",
            "epp.profiles[0].plugins[1].ref (line 6): unknown plugin 'missing'",
        ),
        (
            "epp: {plugins: [{name: q, type: queue-scorer}, {name: p, type: max-score-picker}],"
            " profiles: [{name: d, plugins: [{ref: q}, {ref: p, weight: 2}]}]}",
            "only scorers take a weight; 'p' is a picker",
        ),
        (
            "epp: {plugins: [{name: q, type: queue-scorer}], profiles: [{name: d, plugins: [{ref: q}]}]}",
            "needs exactly one picker, has 0",
        ),
        ("epp: {pick_open_timeout: 0}", "epp.pick_open_timeout (line 6): must be more than 0"),
        ("epp: {pick_open_timeout: -1s}", "epp.pick_open_timeout (line 6): must be a duration"),
        ("epp: {replicas: {key: k}}", "epp.replicas.store (line 6): is required"),
        ("epp: {replicas: {store: 10.0.0.1}}", "epp.replicas.store (line 6): must be a Redis URL"),
        ("epp: {replicas: {store: 'redis://r', history: 0}}", "epp.replicas.history (line 6)"),
        ("epp: {replicas: {store: 'redis://r', timeout: 0}}", "epp.replicas.timeout (line 6)"),
        ("epp: {replicas: {store: 'redis://r', tll: 1}}", "epp.replicas.tll (line 6): unknown"),
    ],
)
def test_epp_section_errors(section: str, expected: str) -> None:
    with pytest.raises(PolicyError) as err:
        load_policy_text(BASE + section, plugins=CATALOG)
    assert any(expected in e for e in err.value.errors), err.value.errors


def test_epp_replicas_defaults_and_values() -> None:
    assert load_policy_text(BASE).epp.replicas is None
    policy = load_policy_text(BASE + "epp: {replicas: {store: 'redis://r:6379/1'}}")
    assert policy.epp.replicas == Replicas("redis://r:6379/1", "kvgate:picks", 20_000, 1.0)
    policy = load_policy_text(
        BASE + "epp: {replicas: {store: 'redis://r', key: a:b, history: 50, timeout: 200ms}}"
    )
    assert policy.epp.replicas == Replicas("redis://r", "a:b", 50, 0.2)


def test_epp_section_custom_profile() -> None:
    policy = load_policy_text(
        BASE
        + """epp:
  plugins:
    - {name: prefix, type: prefix-cache-scorer, params: {block_size_tokens: 32}}
    - {name: sat, type: saturation-filter}
    - {name: pick, type: max-score-picker}
  profiles: [{name: default, plugins: [{ref: sat}, {ref: prefix, weight: 5}, {ref: pick}]}]
"""
    )
    assert [p.type for p in policy.epp.plugins] == [
        "prefix-cache-scorer",
        "saturation-filter",
        "max-score-picker",
    ]
    assert policy.epp.profiles[0].plugins[1].weight == 5
