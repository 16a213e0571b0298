"""Automatic canaries of gateway replicas sharing a real redis-server (their limits' store):
one replica judges (a lease), the others route by the state it saves, the lease passes on when
its holder stops, and a Redis that goes away stops decisions, not routing."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from epp.scheduling.registry import CATALOG
from gateway.control.canary.canaries import Canaries
from loadtest.harness.redis_server import RedisServer
from policies.loader import load_policy_text
from tests.fakes import ManualClock

POLICY = """pools: {{a: {{endpoints: [127.0.0.1:8001]}}, b: {{endpoints: [127.0.0.1:8002]}}}}
routes:
  - model: chat
    pool: a
    canary: {{pool: b, auto: {{steps: [10, 50, 100], hold: 60s, min_requests: 20}}}}
limits: {{store: {{kind: redis, url: "{url}"}}}}
"""


def replica(url: str, clock: ManualClock) -> Canaries:
    manager = Canaries(CollectorRegistry(), clock)
    manager.update(load_policy_text(POLICY.format(url=url), plugins=CATALOG))
    return manager


def serve(manager: Canaries, n: int) -> None:
    controller = manager.controllers["chat"]
    for arm in ("a", "b"):
        for _ in range(n):
            controller.observe(arm, 200, 0.1, 0.02)


def test_replicas_share_one_judge_and_its_decisions(redis_server: RedisServer) -> None:
    redis_url = redis_server.url
    clock = ManualClock()
    first, second = replica(redis_url, clock), replica(redis_url, clock)
    for manager in (first, second):
        serve(manager, 30)
    clock.now += 61
    first.tick()  # takes the lease and promotes
    second.tick()  # not the judge: adopts the saved step
    assert [m.controllers["chat"].weight for m in (first, second)] == [50.0, 50.0]
    assert second.controllers["chat"].state.events[-1]["decision"] == "promote"
    serve(second, 30)  # evidence on the follower alone is not judged
    clock.now += 61
    second.tick()
    assert second.controllers["chat"].state.step == 1
    first.close()  # the judge stops: its lease is released
    second.tick()
    serve(second, 30)
    clock.now += 61
    second.tick()
    assert second.controllers["chat"].state.status == "promoted"
    # an operator's action through either replica reaches the other
    third = replica(redis_url, clock)
    assert third.controllers["chat"].weight == 100.0  # a new replica resumes the saved state
    third.act("chat", "restart")
    second.tick()
    assert second.controllers["chat"].weight == 10.0


def test_without_redis_the_route_keeps_its_weights_and_nothing_is_decided(
    redis_server: RedisServer,
) -> None:
    redis_url = redis_server.url
    clock = ManualClock()
    manager = replica(redis_url, clock)
    controller = manager.controllers["chat"]
    serve(manager, 30)
    redis_server.stop()
    clock.now += 61
    manager.tick()  # no exception: the store is unavailable, no decision is taken
    assert controller.state.step == 0
    assert [p.weight for p in manager.split("chat") or ()] == [90.0, 10.0]
    with pytest.raises(OSError, match="canary state"):
        manager.act("chat", "promote")
    assert controller.weight == 10.0
    # a gateway (re)started while Redis is down starts the canary at its first step
    assert replica(redis_url, clock).controllers["chat"].weight == 10.0
