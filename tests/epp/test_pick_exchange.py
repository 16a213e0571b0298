"""Sibling workers' pickers tell each other their picks over Unix datagrams."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest

from epp.datalayer.placement import placed
from epp.requestcontrol.pick_exchange import PickExchange, SiblingPick
from epp.service import EppService
from policies.loader import load_policy_text

PICK = SiblingPick("10.0.0.1:8000", 1_200, "sql", [(7, [1, 2, 3]), (9, [2**64 - 1])])


async def _soon(condition: Callable[[], object]) -> None:
    """Until ``condition`` holds, for at most a second (datagrams take a turn of the loop)."""
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0.01)


async def test_a_pick_reaches_every_other_worker_and_not_the_sender(tmp_path: Path) -> None:
    got: dict[str, list[SiblingPick]] = {"a": [], "b": [], "c": []}
    ends = {name: PickExchange(str(tmp_path), got[name].append) for name in got}
    for end in ends.values():
        end.start()
    try:
        ends["a"].publish(PICK)
        ends["a"].publish(SiblingPick("10.0.0.2:8000"))  # the base model, nothing placed
        await _soon(lambda: len(got["b"]) == len(got["c"]) == 2)
        assert got["b"] == got["c"] == [PICK, SiblingPick("10.0.0.2:8000")]
        assert got["a"] == [] and ends["a"].sent == 4
    finally:
        for end in ends.values():
            end.stop()
    assert _sockets(tmp_path) == []


async def test_a_sibling_that_binds_just_after_a_lonely_publish_gets_the_next_pick(
    tmp_path: Path,
) -> None:
    """A worker alone looks for the others at every pick: the first picks after a sibling
    starts reach it (they are the ones that place the first prefixes)."""
    got: list[SiblingPick] = []
    early = PickExchange(str(tmp_path), lambda pick: None)
    late = PickExchange(str(tmp_path), got.append)
    early.start()
    try:
        early.publish(PICK)  # nobody to tell yet
        late.start()
        early.publish(PICK)  # at once, well within any rescan interval
        await _soon(lambda: got)
        assert got == [PICK]
    finally:
        late.stop()
        early.stop()


async def test_a_sibling_is_known_from_its_first_datagram(tmp_path: Path) -> None:
    """A worker that has found the others is not rescanned for a second; one that starts
    meanwhile is known from the first datagram it sends (its first scrape or pick)."""
    got: list[SiblingPick] = []
    first = PickExchange(str(tmp_path), lambda pick: None)
    second = PickExchange(str(tmp_path), lambda pick: None)
    third = PickExchange(str(tmp_path), got.append)
    first.start()
    second.start()
    try:
        first.publish(PICK)  # finds the second, and will not look again for a second
        third.start()
        third.publish(SiblingPick("h:1"))  # finds both
        await _soon(lambda: first.received)
        first.publish(PICK)
        await _soon(lambda: got)
        assert got == [PICK]
    finally:
        for end in (first, second, third):
            end.stop()


def _sockets(directory: Path) -> list[Path]:
    return list(directory.glob("*.sock"))


async def test_garbage_and_gone_peers_are_survived(tmp_path: Path) -> None:
    got: list[SiblingPick] = []
    receiver = PickExchange(str(tmp_path), got.append)
    sender = PickExchange(str(tmp_path), lambda pick: None)
    _touch(tmp_path / "dead.sock")  # a worker that died without cleaning up
    receiver.start()
    sender.start()
    try:
        import socket

        raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        raw.sendto(b"\xc1 not msgpack", str(receiver.path))
        raw.sendto(msgpack.packb(["tag", 3]), str(receiver.path))
        raw.sendto(msgpack.packb(["h:1", 0, None, [["tag", [1]]]]), str(receiver.path))
        raw.close()
        sender.publish(SiblingPick("h:1", keys=[(1, [9])]))
        await _soon(lambda: got)
        assert got == [SiblingPick("h:1", keys=[(1, [9])])]
        assert sender.dropped == 1  # the dead socket
    finally:
        sender.stop()
        receiver.stop()


def _touch(path: Path) -> None:
    path.touch()


async def test_a_path_too_long_for_a_socket_leaves_the_worker_running(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    _mkdir(deep)
    end = PickExchange(str(deep), lambda pick: None)
    end.start()  # logs a warning instead of raising
    end.publish(SiblingPick("h:1", keys=[(1, [1])]))  # and does nothing
    end.stop()
    assert end.sent == 0


def _mkdir(path: Path) -> None:
    path.mkdir()


def test_the_directory_is_short_enough_for_sockets(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import os
    import shutil
    import tempfile

    from epp.requestcontrol.pick_exchange import exchange_directory

    monkeypatch.setattr(tempfile, "gettempdir", lambda: "/tmp/" + "x" * 90)
    made = exchange_directory()
    try:
        assert made.startswith("/tmp/kvgate-picks-") and os.path.isdir(made)
    finally:
        shutil.rmtree(made)


async def test_a_sibling_pick_counts_in_the_receivers_placement_and_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where new content and adapters went is decided on every worker's picks: a pick made by
    one worker's picker counts on the other as the same placed tokens and adapter request,
    and its blocks as held there."""
    monkeypatch.setenv("KVGATE_PICKS_DIR", str(tmp_path))
    policy = load_policy_text(
        "pools: {p: {endpoints: [127.0.1.1:10000, 127.0.1.1:10001], adapters: [sql]}}\n"
        "routes: [{model: m, pool: p}, {model: sql, pool: p}]\n"
    )
    sender, receiver = EppService(policy), EppService(policy)
    ends = [s.exchange for s in (sender, receiver)]
    body = {"model": "sql", "prompt": "a system prompt to be placed somewhere " * 20}
    try:
        for end in ends:
            assert end is not None
            end.start()
        request = sender.scheduling_request("p", "r1", "sql", body, {})
        assert request.lora == "sql"
        sent_to = sender.datastore.all()[0]
        sender.dispatched(request, sent_to)
        exchange = receiver.exchange
        assert exchange is not None
        await _soon(lambda: exchange.received)
        there, other = receiver.datastore.all()
        assert there.address == sent_to.address
        assert there.load.placed_adapters == pytest.approx({"sql": 1.0}, rel=1e-3)
        assert placed(there) == pytest.approx(placed(sent_to), rel=1e-3) and placed(there) > 0
        assert placed(other) == 0 and other.load.placed_adapters == {}
        assert receiver.prefix is not None
        same = receiver.scheduling_request("p", "r2", "sql", body, {})
        keys = receiver.prefix.keys(same)
        assert receiver.prefix.match(keys, [there.address, other.address]) == {
            there.address: len(keys),
            other.address: 0,
        }
    finally:
        for end in ends:
            if end is not None:
                end.stop()


async def test_a_scrape_reaches_the_other_workers_as_of_its_arrival(tmp_path: Path) -> None:
    from epp.framework import EndpointMetrics

    got: list[tuple[str, EndpointMetrics]] = []
    receiver = PickExchange(str(tmp_path), lambda pick: None, lambda a, m: got.append((a, m)))
    sender = PickExchange(str(tmp_path), lambda pick: None)
    receiver.start()
    sender.start()
    scraped = EndpointMetrics(
        waiting=2,
        running=5,
        kv_usage=0.75,
        block_size=16,
        num_gpu_blocks=560,
        running_loras=frozenset({"sql", "chat"}),
        waiting_loras=frozenset({"x"}),
        max_loras=2,
        scraped_at=1.0,
    )
    try:
        sender.publish_metrics("h:1", scraped)
        await _soon(lambda: got)
    finally:
        receiver.stop()
        sender.stop()
    (address, metrics), *rest = got
    assert address == "h:1" and not rest
    assert metrics.scraped_at > 1.0  # as of its arrival, on this worker's clock
    metrics.scraped_at = scraped.scraped_at
    assert metrics == scraped
