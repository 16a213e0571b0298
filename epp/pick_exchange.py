"""Picks shared between the gateway's worker processes (``--workers N``), so that each
worker's prefix index also knows what the others sent where: without it a prefix one worker
placed on an endpoint looks cold to the other, which places it again elsewhere, and affinity
halves (measured in docs/benchmarks.md, "Routing").

Each worker's picker binds a Unix datagram socket in a directory the supervisor creates
(``KVGATE_PICKS_DIR``) and, for every pick, sends ``[endpoint address, placed tokens, LoRA
adapter, [[index tag, keys], ...]]`` (msgpack) to every other worker's socket; the receivers
record the keys in the same indexes (``PrefixIndex.learn_keys``) and the new content and the
adapter in what the endpoint was placed lately (``epp.placement``), so that where new prefixes
and adapters go is decided on every worker's picks. Datagrams are hints: one that cannot be
sent at once (a full buffer, a worker restarting) is dropped, never waited for. The directory
is rescanned every second (every 50 ms while no other worker is found), so restarted workers
are found; a worker that starts later has not seen the picks made before it (they are not
replayed) and learns from there on. A socket that cannot be bound (a path too long for one)
leaves that worker without the exchange, with one warning.
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
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

log = logging.getLogger("kvgate.epp")
ENV = "KVGATE_PICKS_DIR"
RESCAN = 1.0  # seconds between looks for the other workers' sockets
RESCAN_ALONE = 0.05  # ... while none has been found (the others are still starting)
MAX_DATAGRAM = 65_000

MAX_PATH = 100  # a Unix socket's path must fit in sun_path (108 bytes on Linux)
_NUMBERS = itertools.count()  # one socket per picker of this process (a reload makes a new one)


@dataclass(frozen=True)
class SiblingPick:
    """What one worker tells the others of a pick: the endpoint, the prompt tokens it had
    not cached (``epp.placement``'s placed content), the request's LoRA adapter, and the
    request's block keys in each prefix index (by index tag)."""

    address: str
    placed: int = 0
    lora: str | None = None
    keys: list[tuple[int, list[int]]] = field(default_factory=list)

    def encode(self) -> bytes:
        data: bytes = msgpack.packb([self.address, self.placed, self.lora, self.keys])
        return data

    @classmethod
    def decode(cls, data: bytes) -> SiblingPick:
        """Raises ``ValueError`` (or ``TypeError``) for a datagram that is not one."""
        address, placed, lora, keys = msgpack.unpackb(data)
        return cls(
            str(address),
            int(placed),
            None if lora is None else str(lora),
            [(int(tag), [int(k) for k in chain]) for tag, chain in keys],
        )


Receiver = Callable[[SiblingPick], None]


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

    def publish(self, pick: SiblingPick) -> None:
        """Tell the other workers of ``pick``."""
        if self._sock is None:
            return
        peers = self._others()
        if not peers:
            return
        data = pick.encode()
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
                pick = SiblingPick.decode(data)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                log.debug("pick exchange: a malformed datagram (%s)", exc)
                continue
            self.on_pick(pick)
            self.received += 1
