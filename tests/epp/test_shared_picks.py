"""Picker replicas share their picks through a Redis stream (a real redis-server): a prefix one
replica placed is warm on all; a replica that starts later catches up; an unreachable store
leaves every replica routing on its own picks, and says so."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

import pytest
import redis.asyncio as redis

from epp.datalayer.placement import placed
from epp.requestcontrol.pick_exchange import SiblingPick
from epp.requestcontrol.shared_picks import SharedPicks
from epp.service import EppService
from loadtest.harness.processes import free_port
from loadtest.harness.redis_server import RedisServer
from policies.loader import load_policy_text
from policies.schema import Policy, Replicas

BODY = {"model": "m", "prompt": "a system prompt every replica should find warm " * 20}


def _policy(url: str) -> Policy:
    return load_policy_text(
        "pools: {p: {endpoints: [127.0.1.1:10000, 127.0.1.1:10001, 127.0.1.1:10002]}}\n"
        "routes: [{model: m, pool: p}]\n"
        f"epp: {{replicas: {{store: '{url}', key: 'test:picks', timeout: 0.2s}}}}\n"
    )


async def _until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition did not come true in time")


def _held(service: EppService, address: str) -> float:
    """How many blocks of ``BODY`` the service's index believes ``address`` holds."""
    assert service.prefix is not None
    request = service.scheduling_request("p", "probe", "m", BODY, {})
    return service.prefix.match(service.prefix.keys(request), [address])[address]


async def test_a_pick_on_one_replica_is_warm_on_the_others(redis_server: RedisServer) -> None:
    replicas = [EppService(_policy(redis_server.url)) for _ in range(3)]
    for replica in replicas:
        await replica.start()
    try:
        a, b, c = replicas
        request = a.scheduling_request("p", "r1", "m", BODY, {})
        target = a.datastore.all()[1]
        a.dispatched(request, target)
        await _until(
            lambda: (
                b.shared is not None
                and c.shared is not None
                and b.shared.received == c.shared.received == 1
            )
        )
        blocks = _held(a, target.address)
        assert blocks > 0
        for other in (b, c):
            assert _held(other, target.address) == blocks
            there = other.datastore.all()[1]
            assert placed(there) == pytest.approx(placed(target), rel=1e-2)
            assert (
                other.pick("p", other.scheduling_request("p", "r2", "m", BODY, {})).result.target
                is there
            )
        assert a.shared is not None and a.shared.received == 0  # not its own pick back
        assert a.shared.sent == 1
    finally:
        for replica in replicas:
            await replica.stop()


async def test_a_session_one_replica_placed_goes_there_from_the_others(
    redis_server: RedisServer,
) -> None:
    """An agent's next call may reach any replica: the session's endpoint is learned by all
    (the profile scores sessions alone, so nothing else decides)."""
    sessions_only = load_policy_text(
        "pools: {p: {endpoints: [127.0.1.1:10000, 127.0.1.1:10001, 127.0.1.1:10002]}}\n"
        "routes: [{model: m, pool: p}]\n"
        "epp:\n"
        "  plugins: [{name: s, type: session-affinity-scorer}, {name: pick, type: max-score-picker}]\n"
        "  profiles: [{name: default, plugins: [{ref: s}, {ref: pick}]}]\n"
        f"  replicas: {{store: '{redis_server.url}', key: 'test:sessions'}}\n"
    )
    a, b = EppService(sessions_only), EppService(sessions_only)
    for replica in (a, b):
        await replica.start()
    try:
        agent = {"x-claude-code-session-id": "agent-7"}
        first = a.scheduling_request("p", "r1", "m", {"model": "m", "prompt": "call 1"}, agent)
        a.dispatched(first, a.datastore.all()[2])
        await _until(lambda: b.shared is not None and b.shared.received == 1)
        for endpoint in b.datastore.all():  # fresh metrics: no endpoint is saturated
            endpoint.metrics = replace(endpoint.metrics, scraped_at=time.monotonic())
        later = b.scheduling_request("p", "r2", "m", {"model": "m", "prompt": "call 2"}, agent)
        assert b.pick("p", later).result.target is b.datastore.all()[2]
    finally:
        for replica in (a, b):
            await replica.stop()


async def test_a_replica_that_starts_later_catches_up(redis_server: RedisServer) -> None:
    first = EppService(_policy(redis_server.url))
    await first.start()
    try:
        target = first.datastore.all()[2]
        first.dispatched(first.scheduling_request("p", "r1", "m", BODY, {}), target)
        assert first.shared is not None
        await _until(lambda: first.shared is not None and first.shared.sent == 1)
        late = EppService(_policy(redis_server.url))
        await late.start()  # reads the history before it returns
        try:
            assert late.shared is not None and late.shared.received == 1
            assert _held(late, target.address) == _held(first, target.address) > 0
        finally:
            await late.stop()
    finally:
        await first.stop()


async def test_a_restarted_replica_gets_its_own_earlier_picks_back(
    redis_server: RedisServer,
) -> None:
    before = EppService(_policy(redis_server.url))
    await before.start()
    target = before.datastore.all()[0]
    before.dispatched(before.scheduling_request("p", "r1", "m", BODY, {}), target)
    await _until(lambda: before.shared is not None and before.shared.sent == 1)
    await before.stop()
    after = EppService(_policy(redis_server.url))
    await after.start()
    try:
        assert _held(after, target.address) == _held(before, target.address) > 0
    finally:
        await after.stop()


async def test_old_picks_count_decayed_in_placement(redis_server: RedisServer) -> None:
    """A pick caught up on counts as placed content as of when it was made (the placement's
    half-life applies), not as of now."""
    got: list[tuple[SiblingPick, float]] = []
    settings = Replicas(redis_server.url, key="test:age")
    writer = SharedPicks(settings, lambda pick, age: None)
    await writer.start()
    writer.publish(SiblingPick("127.0.1.1:10000", 1000))
    await _until(lambda: writer.sent == 1)
    await writer.stop()
    await asyncio.sleep(0.3)
    reader = SharedPicks(settings, lambda pick, age: got.append((pick, age)))
    await reader.start()
    await reader.stop()
    ((pick, age),) = got
    assert pick == SiblingPick("127.0.1.1:10000", 1000)
    assert 0.25 <= age < 5


async def test_an_unreachable_store_leaves_the_replica_routing_and_saying_so() -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    service = EppService(_policy(dead))
    await service.start()  # starts cold, with a warning, within the catch-up wait
    try:
        assert service.shared is not None and not service.shared.shared
        request = service.scheduling_request("p", "r1", "m", BODY, {})
        decision = service.pick("p", request)
        assert decision.result.target is not None
        service.dispatched(request, decision.result.target)  # queued, never waited for
        assert _held(service, decision.result.target.address) > 0  # its own picks still count
        service.update_gauges()
        text = service.metrics.registry.get_sample_value("kvgate_epp_shared_view_up")
        assert text == 0
    finally:
        await service.stop()


async def test_a_store_that_comes_back_gets_the_picks_kept_meanwhile() -> None:
    server = RedisServer(free_port())
    url = server.url
    writer = EppService(_policy(url))
    await writer.start()  # the store is not there yet: cold
    try:
        target = writer.datastore.all()[1]
        writer.dispatched(writer.scheduling_request("p", "r1", "m", BODY, {}), target)
        assert writer.shared is not None and writer.shared.sent == 0
        server.start()
        await _until(lambda: writer.shared is not None and writer.shared.sent == 1)
        assert writer.shared.shared
        reader = EppService(_policy(url))
        await reader.start()
        try:
            assert _held(reader, target.address) == _held(writer, target.address) > 0
        finally:
            await reader.stop()
    finally:
        await writer.stop()
        server.stop()


async def test_a_store_that_goes_away_mid_run_is_survived(redis_server: RedisServer) -> None:
    a, b = EppService(_policy(redis_server.url)), EppService(_policy(redis_server.url))
    await a.start()
    await b.start()
    try:
        assert a.shared is not None and b.shared is not None
        redis_server.stop()
        await _until(lambda: a.shared is not None and not a.shared.shared, seconds=5)
        request = a.scheduling_request("p", "r1", "m", BODY, {})
        target = a.pick("p", request).result.target
        assert target is not None
        a.dispatched(request, target)
        assert _held(a, target.address) > 0 and _held(b, target.address) == 0
        redis_server.start()  # the same port: both find it again, and b learns the kept pick
        await _until(lambda: b.shared is not None and b.shared.received == 1, seconds=10)
        assert a.shared.shared and b.shared.shared
        assert _held(b, target.address) == _held(a, target.address)
    finally:
        await a.stop()
        await b.stop()


async def test_a_round_trips_picks_share_one_entry_and_single_entries_still_read(
    redis_server: RedisServer,
) -> None:
    """Picks queued together go as one stream entry (readers pay per entry); an entry of one
    pick, as a replica of an earlier version writes, is still learnt."""
    got: list[SiblingPick] = []
    settings = Replicas(redis_server.url, key="test:batch")
    writer = SharedPicks(settings, lambda pick, age: None)
    await writer.start()
    picks = [SiblingPick(f"127.0.1.1:{10000 + n}", n) for n in range(50)]
    for pick in picks:  # one turn of the loop: one round trip
        writer.publish(pick)
    await _until(lambda: writer.sent == 50)
    await writer.stop()
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert await client.xlen("test:batch") == 1
        await client.xadd("test:batch", {"r": b"earlier!", "p": SiblingPick("old:1", 7).encode()})
    finally:
        await client.aclose()
    reader = SharedPicks(settings, lambda pick, age: got.append(pick))
    await reader.start()
    await reader.stop()
    assert got == [*picks, SiblingPick("old:1", 7)] and reader.received == 51
