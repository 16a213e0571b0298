"""The model registry's stages: the changes an operator may make and those refused, the saved
stages against the declared ones, the routes they resolve to, a canary's verdict settled once,
and the stages kept in a file (a restart) and in a real Redis (replicas)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from epp.scheduling.registry import CATALOG
from gateway.control.canary.canaries import Canaries
from gateway.control.models.registry import ModelRegistry
from gateway.control.models.stages import ModelStages, StageConflict, change, in_force
from loadtest.harness.redis_server import RedisServer
from policies.loader import load_policy_text
from policies.models_section import ModelVersion
from policies.schema import Policy
from tests.fakes import ManualClock

POLICY = """pools:
  v1: {{endpoints: [127.0.0.1:8001]}}
  v2: {{endpoints: [127.0.0.1:8002]}}
  v3: {{endpoints: [127.0.0.1:8003]}}
models:
  chat:
    canary: {{steps: [10, 100], hold: 60s, min_requests: 5}}
    versions:
      - {{version: 1, pool: v1, stage: production}}
      - {{version: 2, pool: v2}}
      {more}
routes:
  - {{model: chat, fallback: [other]}}
  - {{model: other, pool: v3}}
{extra}"""


def policy(more: str = "", extra: str = "") -> Policy:
    return load_policy_text(POLICY.format(more=more, extra=extra), plugins=CATALOG)


def fresh() -> ModelStages:
    return in_force(policy().models["chat"], None)


def test_a_version_goes_from_staging_through_canary_to_production() -> None:
    stages = fresh()
    assert stages.stages == {"1": "production", "2": "staging"}
    event = change(stages, "2", "promote", 10.0, "admin")
    assert (event["from"], event["to"], stages.canary_run) == ("staging", "canary", "2@10.000")
    change(stages, "2", "promote", 20.0, "canary")
    assert stages.stages == {"1": "archived", "2": "production"}
    assert (stages.canary_run, stages.history, stages.generation) == ("", ["1"], 2)
    # production rolls back to the version it had before
    event = change(stages, "2", "rollback", 30.0, "admin")
    assert stages.stages == {"1": "production", "2": "archived"} and event["restored"] == "1"
    change(stages, "2", "promote", 40.0, "admin")  # archived -> staging
    assert stages.stages["2"] == "staging"
    change(stages, "2", "archive", 50.0, "admin")
    assert [e["action"] for e in stages.events] == [
        "promote",
        "promote",
        "rollback",
        "promote",
        "archive",
    ]


@pytest.mark.parametrize(
    ("setup", "version", "action", "message"),
    [
        ((), "1", "promote", "already in production"),
        ((), "1", "archive", "is in production"),
        ((), "1", "rollback", "no earlier production version"),
        ((), "2", "rollback", "only a canary or production rolls back"),
        ((("2", "archive"),), "2", "archive", "already archived"),
        ((("2", "promote"),), "1", "rollback", "version 2 is a canary against it"),
    ],
)
def test_changes_that_do_not_apply_are_refused_and_change_nothing(
    setup: tuple[tuple[str, str], ...], version: str, action: str, message: str
) -> None:
    stages = fresh()
    for v, a in setup:
        change(stages, v, a, 1.0, "admin")
    before = stages.to_json()
    with pytest.raises(StageConflict, match=message):
        change(stages, version, action, 2.0, "admin")
    assert stages.to_json() == before


def test_one_canary_at_a_time_and_unknown_versions_and_actions() -> None:
    stages = in_force(policy("- {version: 3, pool: v3}").models["chat"], None)
    change(stages, "2", "promote", 1.0, "admin")
    with pytest.raises(StageConflict, match="version 2 is the canary"):
        change(stages, "3", "promote", 2.0, "admin")
    with pytest.raises(KeyError):
        change(stages, "9", "promote", 2.0, "admin")
    with pytest.raises(ValueError, match="unknown action 'deploy'"):
        change(stages, "2", "deploy", 2.0, "admin")


def test_saved_stages_win_over_declared_ones_and_new_versions_enter_as_declared() -> None:
    saved = fresh()
    change(saved, "2", "promote", 1.0, "admin")
    change(saved, "2", "promote", 2.0, "admin")  # 2 is production, 1 archived
    # a new version declared in production while 2 holds it enters as staging
    declared = policy().models["chat"]
    one, two = declared.versions
    versions = (replace(one, stage="archived"), two, ModelVersion("3", "v3", "production"))
    model = replace(declared, versions=versions)
    merged = in_force(model, ModelStages.from_json(saved.to_json()))
    assert merged.stages == {"1": "archived", "2": "production", "3": "staging"}
    # the saved production version left the policy: the declared one is production again
    gone = ModelStages("chat", {"1": "archived", "9": "production"})
    assert in_force(policy().models["chat"], gone).stages == {"1": "production", "2": "staging"}


def test_the_route_takes_production_and_a_canary_against_it(tmp_path: Path) -> None:
    declared = policy(extra=f"state_dir: {tmp_path}")
    registry = ModelRegistry(CollectorRegistry())
    registry.update(declared)
    route = registry.resolve(declared).route_for("chat")
    assert route is not None and (route.pool, route.auto_canary, route.fallback) == (
        "v1",
        None,
        ("other",),
    )
    registry.act("chat", "2", "promote", "ops")
    resolved = registry.resolve(declared)
    route = resolved.route_for("chat")
    assert route is not None and route.auto_canary is not None
    assert (route.auto_canary.baseline, route.auto_canary.pool) == ("v1", "v2")
    assert route.auto_canary.run == registry.stages["chat"].canary_run
    assert [(p.pool, p.weight) for p in route.canary] == [("v1", 90.0), ("v2", 10.0)]
    assert resolved.route_for("other") == declared.route_for("other")
    assert declared.route_for("chat") == policy().route_for("chat")  # as loaded, unchanged
    registry.close()


def verdict(registry: ModelRegistry, canaries: Canaries, declared: Policy, status: str) -> None:
    canaries.update(registry.resolve(declared))
    canaries.controllers["chat"].state.status = status


def test_a_canary_verdict_is_settled_once_across_workers(tmp_path: Path) -> None:
    declared = policy(extra=f"state_dir: {tmp_path}")
    clock = ManualClock()
    workers = [ModelRegistry(CollectorRegistry(), clock) for _ in range(2)]
    canaries = [Canaries(CollectorRegistry(), clock) for _ in range(2)]
    for registry in workers:
        registry.update(declared)
    workers[0].act("chat", "2", "promote", "ops")
    assert workers[1].tick(canaries[1])  # reads the saved canary
    for registry, manager in zip(workers, canaries, strict=True):
        verdict(registry, manager, declared, "promoted")
    assert workers[0].tick(canaries[0]) and workers[1].tick(canaries[1])
    for registry in workers:
        assert registry.stages["chat"].stages == {"1": "archived", "2": "production"}
        assert [e["by"] for e in registry.stages["chat"].events] == ["ops", "canary"]
        route = registry.resolve(declared).route_for("chat")
        assert route is not None and (route.pool, route.auto_canary) == ("v2", None)
    # a restart reads the saved stages
    again = ModelRegistry(CollectorRegistry(), clock)
    again.update(declared)
    assert again.stages["chat"].stages == {"1": "archived", "2": "production"}


def test_a_rolled_back_canary_archives_its_version(tmp_path: Path) -> None:
    declared = policy(extra=f"state_dir: {tmp_path}")
    registry, canaries = ModelRegistry(CollectorRegistry()), Canaries(CollectorRegistry())
    registry.update(declared)
    registry.act("chat", "2", "promote", "ops")
    verdict(registry, canaries, declared, "rolled_back")
    assert registry.tick(canaries)
    assert registry.stages["chat"].stages == {"1": "production", "2": "archived"}
    assert not registry.tick(canaries)  # settled: nothing more to do
    route = registry.resolve(declared).route_for("chat")
    assert route is not None and (route.pool, route.canary) == ("v1", ())


def test_replicas_share_the_stages_through_redis(redis_server: RedisServer) -> None:
    declared = policy(extra=f'limits: {{store: {{kind: redis, url: "{redis_server.url}"}}}}')
    first, second = ModelRegistry(CollectorRegistry()), ModelRegistry(CollectorRegistry())
    for registry in (first, second):
        registry.update(declared)
    first.act("chat", "2", "promote", "ops")
    assert second.tick(Canaries(CollectorRegistry()))
    assert second.stages["chat"].stages == {"1": "production", "2": "canary"}
    redis_server.stop()  # Redis gone: the stages in force stay, a change is refused
    assert not second.tick(Canaries(CollectorRegistry()))
    assert second.stages["chat"].stages["2"] == "canary"
    with pytest.raises(OSError, match="models state in Redis"):
        second.act("chat", "2", "archive", "ops")
    for registry in (first, second):
        registry.close()


def test_a_version_declared_in_canary_starts_its_canary_at_once(tmp_path: Path) -> None:
    declared = policy("- {version: 3, pool: v3, stage: canary}", extra=f"state_dir: {tmp_path}")
    registry = ModelRegistry(CollectorRegistry())
    registry.update(declared)
    route = registry.resolve(declared).route_for("chat")
    assert route is not None and route.auto_canary is not None
    assert (route.auto_canary.pool, route.auto_canary.run) == ("v3", "3@declared")
    saved = ModelStages.from_json((tmp_path / "models-chat.json").read_text())
    assert saved.stages == {"1": "production", "2": "staging", "3": "canary"}  # kept as found


def test_a_declared_stage_the_saved_ones_overrule_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = policy(extra=f"state_dir: {tmp_path}")
    registry = ModelRegistry(CollectorRegistry())
    registry.update(first)
    registry.act("chat", "2", "promote", "ops")
    registry.act("chat", "2", "promote", "ops")  # 2 in production, 1 archived
    # the policy now declares a new version 3 in production (and 1 back in staging)
    changed = load_policy_text(
        f"""pools:
  v1: {{endpoints: [127.0.0.1:8001]}}
  v2: {{endpoints: [127.0.0.1:8002]}}
  v3: {{endpoints: [127.0.0.1:8003]}}
models:
  chat:
    versions:
      - {{version: 1, pool: v1}}
      - {{version: 2, pool: v2}}
      - {{version: 3, pool: v3, stage: production}}
state_dir: {tmp_path}
""",
        plugins=CATALOG,
    )
    caplog.set_level("WARNING", logger="kvgate.gateway")
    registry.update(changed)
    for _ in range(3):
        registry.tick(Canaries(CollectorRegistry()))
    assert registry.stages["chat"].stages == {"1": "archived", "2": "production", "3": "staging"}
    assert caplog.text.count("version 3 is declared production") == 1
