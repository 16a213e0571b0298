"""Picks shared between the gateway's worker processes (``--workers N``), so that each
worker's prefix index also knows what the others sent where: without it a prefix one worker
placed on an endpoint looks cold to the other, which places it again elsewhere, and affinity
halves (measured in docs/benchmarks.md, "Routing").

Each worker's picker binds a Unix datagram socket in a directory the supervisor creates
(``KVGATE_PICKS_DIR``) and, for every pick, sends ``[index tag, endpoint address, keys]``
(msgpack) to every other worker's socket; the receivers record it in the same index
(``PrefixIndex.learn_keys``). Datagrams are hints: one that cannot be sent at once (a full
buffer, a worker restarting) is dropped, never waited for. The directory is rescanned every
second (every 50 ms while no other worker is found), so restarted workers are found; a worker
that starts later has not seen the picks made before it (they are not replayed) and learns
from there on. A socket that cannot be bound (a path too long for one) leaves that worker
without the exchange, with one warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgpack

log = logging.getLogger("kvgate.epp")
ENV = "KVGATE_PICKS_DIR"
RESCAN = 1.0  # seconds between looks for the other workers' sockets
RESCAN_ALONE = 0.05  # ... while none has been found (the others are still starting)
MAX_DATAGRAM = 65_000

MAX_PATH = 100  # a Unix socket's path must fit in sun_path (108 bytes on Linux)
_NUMBERS = itertools.count()  # one socket per picker of this process (a reload makes a new one)

Receiver = Callable[[int, str, list[int]], None]  # (index tag, endpoint address, keys)


def exchange_directory() -> str:
    """A new directory for a gateway's workers' sockets: under the temporary directory, or
    under /tmp when that path is too long for a socket's (the caller removes it)."""
    base = tempfile.gettempdir()
    if len(base) > MAX_PATH - 40 and os.path.isdir("/tmp"):
        base = "/tmp"
    return tempfile.mkdtemp(prefix="kvgate-picks-", dir=base)


class PickExchange:
    """One worker's end: ``publish`` its picks, ``on_pick`` receives the others'."""

    def __init__(self, directory: str, on_pick: Receiver) -> None:
        self.directory = Path(directory)
        self.on_pick = on_pick
        self.path = self.directory / f"{os.getpid()}-{next(_NUMBERS)}.sock"
        self.sent = self.received = self.dropped = 0
        self._sock: socket.socket | None = None
        self._peers: list[str] = []
        self._scanned = 0.0

    @classmethod
    def from_environment(cls, on_pick: Receiver) -> PickExchange | None:
        directory = os.environ.get(ENV)
        return cls(directory, on_pick) if directory else None

    def start(self) -> None:
        """Bind this worker's socket; if it cannot be (a path too long, the directory gone),
        the worker runs without the exchange and says so once."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        try:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            sock.bind(str(self.path))
        except OSError as exc:
            sock.close()
            log.warning("picks are not shared with the other workers (%s: %s)", self.path, exc)
            return
        self._sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._read)

    def stop(self) -> None:
        if self._sock is None:
            return
        with contextlib.suppress(ValueError, RuntimeError):
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
        self._sock.close()
        self._sock = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _others(self) -> list[str]:
        now = time.monotonic()
        if now - self._scanned >= (RESCAN if self._peers else RESCAN_ALONE):
            self._scanned = now
            self._peers = [str(p) for p in self.directory.glob("*.sock") if p != self.path]
        return self._peers

    def publish(self, tag: int, address: str, keys: list[int]) -> None:
        """Tell the other workers that ``address`` was sent a request of ``keys``."""
        if self._sock is None or not keys:
            return
        peers = self._others()
        if not peers:
            return
        data = msgpack.packb([tag, address, keys])
        if len(data) > MAX_DATAGRAM:
            return
        for peer in peers:
            try:
                self._sock.sendto(data, peer)
                self.sent += 1
            except OSError:  # full, or the peer is gone: a hint, not a promise
                self.dropped += 1

    def _read(self) -> None:
        assert self._sock is not None
        for _ in range(256):  # what has arrived, then back to the loop
            try:
                data = self._sock.recv(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("pick exchange: %s", exc)
                return
            try:
                tag, address, keys = msgpack.unpackb(data)
                self.on_pick(int(tag), str(address), [int(k) for k in keys])
                self.received += 1
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                log.debug("pick exchange: a malformed datagram (%s)", exc)
