"""The ``models:`` section: a registry's versions and their stages, the route it takes or adds,
and the errors a broken registry gets, each naming its field and line."""

from __future__ import annotations

import pytest

from epp.scheduling.registry import CATALOG
from policies.errors import PolicyError
from policies.loader import load_policy_text

POOLS = "pools:\n  a: {endpoints: [127.0.0.1:8001]}\n  b: {endpoints: [127.0.0.1:8002]}\n"
SHA = "sha256:" + "ab" * 32


def errors_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as err:
        load_policy_text(text, plugins=CATALOG)
    return err.value.errors


def test_a_registered_model_is_routed_to_its_production_version() -> None:
    policy = load_policy_text(
        POOLS
        + "models:\n  chat:\n    canary: {steps: [5, 100], hold: 2m}\n    versions:\n"
        + f"      - {{version: 7, pool: a, stage: production, path: /m/7, checksum: {SHA}}}\n"
        + "      - {version: '8', pool: b, framework: vllm, precision: fp8}\n",
        plugins=CATALOG,
    )
    chat = policy.models["chat"]
    assert [(v.version, v.pool, v.stage) for v in chat.versions] == [
        ("7", "a", "production"),
        ("8", "b", "staging"),  # the stage a version starts in unless it says
    ]
    assert (chat.versions[0].path, chat.versions[0].checksum) == ("/m/7", SHA)
    assert (chat.versions[1].framework, chat.versions[1].precision) == ("vllm", "fp8")
    assert (chat.canary.steps, chat.canary.hold) == ((5.0, 100.0), 120.0)
    route = policy.route_for("chat")  # no route names it: the registry adds one
    assert route is not None and route.pool == "a"


def test_a_route_of_a_registered_model_adds_its_traffic_policies_but_no_pools() -> None:
    registry = "models:\n  chat:\n    versions: [{version: 1, pool: a, stage: production}]\n"
    policy = load_policy_text(
        POOLS + registry + "routes:\n  - {model: chat, resume: false}\n", plugins=CATALOG
    )
    route = policy.route_for("chat")
    assert route is not None and (route.pool, route.resume) == ("a", False)
    assert errors_of(POOLS + registry + "routes:\n  - {model: chat, pool: b}\n") == [
        "routes[0] (line 8): takes its pools from models.chat (its versions' stages)"
    ]


@pytest.mark.parametrize(
    ("versions", "errors"),
    [
        (
            "[{version: 1, pool: a}]",
            ["models.chat.versions (line 6): needs exactly one version in production"],
        ),
        (
            "[{version: 1, pool: a, stage: production}, {version: 1, pool: b, stage: canary},"
            " {version: 2, pool: a, stage: canary}]",
            [
                "models.chat.versions (line 6): version '1' is listed twice",
                "models.chat.versions (line 6): may have one version in canary at a time",
            ],
        ),
        (
            "[{version: 1, pool: z, stage: live, checksum: md5:abc, owner: me}]",
            [
                "models.chat.versions[0].owner (line 6): unknown field (expected one of: "
                "checksum, framework, path, pool, precision, stage, version)",
                "models.chat.versions[0].pool (line 6): unknown pool 'z' (pools: a, b)",
                "models.chat.versions[0].checksum (line 6): must be sha256:<64 hex> or "
                "sha512:<128 hex>",
                "models.chat.versions[0].stage (line 6): must be one of staging, canary, "
                "production, archived; got 'live'",
                "models.chat.versions (line 6): needs exactly one version in production",
            ],
        ),
        ("[]", ["models.chat.versions (line 6): needs at least one version"]),
        (
            "[{version: a/b, pool: a, stage: production}]",
            [
                "models.chat.versions[0].version (line 6): must not contain '/' (it names the "
                "version in URLs)"
            ],
        ),
    ],
)
def test_registry_errors_name_the_field(versions: str, errors: list[str]) -> None:
    assert errors_of(POOLS + f"models:\n  chat:\n    versions: {versions}\n") == errors
