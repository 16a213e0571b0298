"""Sibling workers' pickers tell each other their picks over Unix datagrams."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack

from epp.pick_exchange import PickExchange


async def test_a_pick_reaches_every_other_worker_and_not_the_sender(tmp_path: Path) -> None:
    got: dict[str, list[tuple[int, str, list[int]]]] = {"a": [], "b": [], "c": []}
    ends = {
        name: PickExchange(str(tmp_path), lambda t, addr, k, n=name: got[n].append((t, addr, k)))
        for name in got
    }
    for end in ends.values():
        end.start()
    try:
        ends["a"].publish(7, "10.0.0.1:8000", [1, 2, 3])
        ends["a"].publish(7, "10.0.0.1:8000", [])  # nothing to tell
        for _ in range(100):
            if got["b"] and got["c"]:
                break
            await asyncio.sleep(0.01)
        assert got["b"] == got["c"] == [(7, "10.0.0.1:8000", [1, 2, 3])]
        assert got["a"] == [] and ends["a"].sent == 2
    finally:
        for end in ends.values():
            end.stop()
    assert _sockets(tmp_path) == []


def _sockets(directory: Path) -> list[Path]:
    return list(directory.glob("*.sock"))


async def test_garbage_and_gone_peers_are_survived(tmp_path: Path) -> None:
    got: list[tuple[int, str, list[int]]] = []
    receiver = PickExchange(str(tmp_path), lambda t, a, k: got.append((t, a, k)))
    sender = PickExchange(str(tmp_path), lambda t, a, k: None)
    _touch(tmp_path / "dead.sock")  # a worker that died without cleaning up
    receiver.start()
    sender.start()
    try:
        import socket

        raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        raw.sendto(b"\xc1 not msgpack", str(receiver.path))
        raw.sendto(msgpack.packb(["tag", 3]), str(receiver.path))
        raw.close()
        sender.publish(1, "h:1", [9])
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.01)
        assert got == [(1, "h:1", [9])]
        assert sender.dropped == 1  # the dead socket
    finally:
        sender.stop()
        receiver.stop()


def _touch(path: Path) -> None:
    path.touch()


async def test_a_path_too_long_for_a_socket_leaves_the_worker_running(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    _mkdir(deep)
    end = PickExchange(str(deep), lambda t, a, k: None)
    end.start()  # logs a warning instead of raising
    end.publish(1, "h:1", [1])  # and does nothing
    end.stop()
    assert end.sent == 0


def _mkdir(path: Path) -> None:
    path.mkdir()


def test_the_directory_is_short_enough_for_sockets(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import os
    import shutil
    import tempfile

    from epp.pick_exchange import exchange_directory

    monkeypatch.setattr(tempfile, "gettempdir", lambda: "/tmp/" + "x" * 90)
    made = exchange_directory()
    try:
        assert made.startswith("/tmp/kvgate-picks-") and os.path.isdir(made)
    finally:
        shutil.rmtree(made)
