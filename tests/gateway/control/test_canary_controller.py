"""Automatic canaries on a clock of their own: the gates against the baseline arm, holds,
decisions, the state file (restarts, several workers, one judge) and operators' actions."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from epp.scheduling.registry import CATALOG
from gateway.control.canary.canaries import Canaries
from gateway.control.canary.controller import CanaryController
from gateway.control.canary.state import CanaryState, StateFile, state_file_name
from policies.loader import load_policy_text
from policies.schema import Policy
from tests.fakes import ManualClock, close_after_test

POLICY = """pools: {{a: {{endpoints: [127.0.0.1:8001]}}, b: {{endpoints: [127.0.0.1:8002]}}}}
routes:
  - model: chat
    pool: a
    canary:
      pool: b
      auto: {{steps: [10, 50, 100], hold: 60s, min_requests: 50{gates}}}
{shadow}
state_dir: {state}
"""


def policy(state: Path, gates: str = "", shadow: str = "") -> Policy:
    text = POLICY.format(gates=gates, shadow=shadow, state=state)
    return load_policy_text(text, plugins=CATALOG)


def canaries(state: Path, clock: ManualClock, **kwargs: str) -> tuple[Canaries, CollectorRegistry]:
    registry = CollectorRegistry()
    manager = close_after_test(Canaries(registry, clock))
    manager.update(policy(state, **kwargs))
    return manager, registry


def serve(
    controller: CanaryController,
    n: int,
    *,
    baseline: tuple[int, float] = (200, 0.1),
    canary: tuple[int, float] = (200, 0.1),
) -> None:
    """``n`` requests on each arm: (status, TTFT); streams of 11 tokens 0.2 s after the TTFT."""
    for arm, (status, ttft) in (
        (controller.auto.baseline, baseline),
        (controller.auto.pool, canary),
    ):
        for i in range(n):
            controller.observe(arm, status, ttft * (1 + i % 5 / 100), 0.02)


def test_equal_arms_promote_step_by_step_to_100(tmp_path: Path) -> None:
    clock = ManualClock()
    manager, registry = canaries(tmp_path, clock)
    controller = manager.controllers["chat"]
    assert [(p.pool, p.weight) for p in manager.split("chat") or ()] == [("a", 90.0), ("b", 10.0)]
    serve(controller, 60)
    manager.tick()
    assert controller.state.step == 0  # evidence enough, hold not over
    clock.now += 61
    manager.tick()
    assert (controller.state.step, controller.weight) == (1, 50.0)
    assert controller.arms["b"].requests == 0  # a new step starts its evidence afresh
    manager.tick()
    assert controller.state.step == 1  # no evidence yet
    serve(controller, 60)
    clock.now += 61
    manager.tick()
    assert (controller.state.status, controller.weight) == ("promoted", 100.0)
    assert [p.weight for p in manager.split("chat") or ()] == [0.0, 100.0]
    assert [e["decision"] for e in controller.state.events] == ["promote", "complete"]
    sample = registry.get_sample_value
    assert sample("kvgate_canary_weight", {"route": "chat", "pool": "b"}) == 100.0
    assert sample("kvgate_canary_status", {"route": "chat", "status": "promoted"}) == 1.0
    labels = {"route": "chat", "decision": "complete", "by": "gates"}
    assert sample("kvgate_canary_decisions_total", labels) == 1.0


@pytest.mark.parametrize(
    ("canary", "breached"),
    [((503, 0.1), ["error_rate"]), ((200, 0.2), ["ttft_p95"])],
)
def test_a_worse_canary_is_rolled_back_before_its_hold_ends(
    tmp_path: Path, canary: tuple[int, float], breached: list[str]
) -> None:
    clock = ManualClock()
    manager, registry = canaries(tmp_path, clock)
    controller = manager.controllers["chat"]
    serve(controller, 49, canary=canary)
    manager.tick()
    assert controller.state.status == "running"  # 49 < min_requests
    serve(controller, 1, canary=canary)
    manager.tick()
    assert (controller.state.status, controller.weight) == ("rolled_back", 0.0)
    (event,) = controller.state.events
    assert event["breached"] == breached and event["by"] == "gates"
    assert [p.weight for p in manager.split("chat") or ()] == [100.0, 0.0]
    serve(controller, 100)
    clock.now += 3600
    manager.tick()
    assert controller.state.status == "rolled_back"  # it stays stopped
    gate = breached[0]
    ratio = registry.get_sample_value("kvgate_canary_gate_ratio", {"route": "chat", "gate": gate})
    assert ratio is not None and ratio > 1


def test_errors_under_the_floor_do_not_roll_back(tmp_path: Path) -> None:
    clock = ManualClock()
    manager, _ = canaries(tmp_path, clock)
    controller = manager.controllers["chat"]
    serve(controller, 300)
    controller.observe("b", 500, None, None)  # 1 in 301 against none: below the 0.5% floor
    clock.now += 61
    manager.tick()
    assert controller.state.step == 1


def test_the_shadow_gate_reads_the_routes_comparisons(tmp_path: Path) -> None:
    clock = ManualClock()
    shadow = "    shadow: {pool: b, sample: 1.0}"
    manager, _ = canaries(tmp_path, clock, shadow=shadow)
    controller = manager.controllers["chat"]
    serve(controller, 60)
    for _ in range(18):
        manager.shadow_result("chat", "match")
    manager.shadow_result("chat", "mismatch")
    manager.tick()  # 19 comparisons: not judged yet
    assert controller.state.status == "running"
    manager.shadow_result("chat", "mismatch")  # 2 in 20: 10% > 5%
    manager.tick()
    assert controller.state.status == "rolled_back"
    assert controller.state.events[-1]["breached"] == ["shadow_mismatch"]


def test_the_state_survives_a_restart_unless_the_canary_changed(tmp_path: Path) -> None:
    clock = ManualClock()
    manager, _ = canaries(tmp_path, clock)
    serve(manager.controllers["chat"], 60)
    clock.now += 61
    manager.tick()
    manager.close()
    again, _ = canaries(tmp_path, clock)
    assert (again.controllers["chat"].state.step, again.controllers["chat"].weight) == (1, 50.0)
    again.close()
    changed, _ = canaries(tmp_path, clock, gates=", gates: {error_rate: 2x}")
    assert (changed.controllers["chat"].state.step, changed.controllers["chat"].weight) == (0, 10.0)


def test_a_reload_of_the_unchanged_canary_keeps_its_evidence(tmp_path: Path) -> None:
    clock = ManualClock()
    manager, _ = canaries(tmp_path, clock)
    controller = manager.controllers["chat"]
    serve(controller, 10)
    manager.update(policy(tmp_path))
    assert manager.controllers["chat"] is controller
    assert controller.arms["a"].requests == 10


def test_one_worker_judges_and_the_others_follow_the_file(tmp_path: Path) -> None:
    clock = ManualClock()
    judge, _ = canaries(tmp_path, clock)
    follower, _ = canaries(tmp_path, clock)
    judge.tick()
    follower.tick()
    path = tmp_path / state_file_name("chat")
    assert (
        StateFile(path, CanaryState.from_json).is_judge() is False
    )  # held by the first manager's store
    serve(follower.controllers["chat"], 200)  # the follower's evidence is never judged
    clock.now += 61
    follower.tick()
    assert follower.controllers["chat"].state.step == 0
    serve(judge.controllers["chat"], 60)
    judge.tick()
    follower.tick()
    assert follower.controllers["chat"].weight == 50.0
    judge.close()  # the judge exits: the follower takes over
    serve(follower.controllers["chat"], 60)
    clock.now += 61
    follower.tick()
    assert follower.controllers["chat"].state.status == "promoted"


def test_operators_pause_resume_force_and_restart(tmp_path: Path) -> None:
    clock = ManualClock()
    manager, _ = canaries(tmp_path, clock)
    controller = manager.controllers["chat"]
    assert manager.act("chat", "pause")["status"] == "paused"
    serve(controller, 60)
    clock.now += 61
    manager.tick()
    assert controller.state.step == 0  # paused: not judged
    assert manager.act("chat", "resume")["status"] == "running"
    assert manager.act("chat", "promote")["weight"] == 50.0
    assert manager.act("chat", "rollback")["weight"] == 0.0
    summary = manager.act("chat", "restart")
    assert (summary["status"], summary["weight"]) == ("running", 10.0)
    assert [e["by"] for e in controller.state.events] == ["admin"] * 5
    with pytest.raises(ValueError, match="unknown action"):
        manager.act("chat", "explode")
    with pytest.raises(KeyError):
        manager.act("other", "pause")


def test_requests_the_client_gave_up_on_are_no_evidence(tmp_path: Path) -> None:
    clock = ManualClock()
    manager, _ = canaries(tmp_path, clock)
    controller = manager.controllers["chat"]
    for _ in range(100):
        controller.observe("b", 499, None, None)
    assert controller.arms["b"].requests == 0
    controller.observe("b", 404, 0.1, None)  # answered: counted, neither an error nor a latency
    assert (controller.arms["b"].requests, controller.arms["b"].errors) == (1, 0)
    assert controller.arms["b"].ttft.quantile(0.95) is None
