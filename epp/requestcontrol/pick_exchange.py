"""Picks shared between the gateway's worker processes (``--workers N``), so that each
worker's prefix index also knows what the others sent where: without it a prefix one worker
placed on an endpoint looks cold to the other, which places it again elsewhere, and affinity
halves (measured in docs/benchmarks.md, "Routing").

Each worker's picker binds a Unix datagram socket in a directory the supervisor creates
(``KVGATE_PICKS_DIR``) and, for every pick, sends ``[endpoint address, placed tokens, LoRA
adapter, [[index tag, keys], ...], session]`` (msgpack) to every other worker's socket; the
receivers record the keys in the same indexes (``PrefixIndex.learn_keys``), the session where
its affinity scorer keeps them, and the new content and the adapter in what the endpoint was
placed lately (``epp.datalayer.placement``), so that where new prefixes and adapters go is
decided on every worker's picks. Datagrams are hints: one that cannot be sent at once (a full
buffer, a worker restarting) is dropped, never waited for. The directory is rescanned every
second (at every datagram while no other worker is found, so the first picks after a sibling
starts reach it), and a sibling is known from the first datagram it sends, so restarted workers
are found; a worker that starts later has not seen the picks made before it (they are not
replayed) and learns from there on. A socket that cannot be bound (a path too long for one)
leaves that worker without the exchange, with one warning.

The workers share their metrics scrapes the same way: each scrape a worker makes is sent to
the others (the endpoint's address and the picker's view of its metrics), which take it as
their own scrape of that endpoint and skip theirs while a sibling's keep coming
(``epp.datalayer.scraper``): N workers scrape an endpoint about as often as one.
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
from typing import Any

import msgpack

from epp.framework import EndpointMetrics

log = logging.getLogger("kvgate.epp")
ENV = "KVGATE_PICKS_DIR"
RESCAN = 1.0  # seconds between looks for the other workers' sockets
MAX_DATAGRAM = 65_000

MAX_PATH = 100  # a Unix socket's path must fit in sun_path (108 bytes on Linux)
_NUMBERS = itertools.count()  # one socket per picker of this process (a reload makes a new one)
_PICK, _METRICS = 0, 1  # a datagram's first item: what it carries


@dataclass(frozen=True)
class SiblingPick:
    """What one worker tells the others of a pick: the endpoint, the prompt tokens it had
    not cached (``epp.datalayer.placement``'s placed content), the request's LoRA adapter, the
    request's block keys in each prefix index (by index tag) and its session ("": none)."""

    address: str
    placed: int = 0
    lora: str | None = None
    keys: list[tuple[int, list[int]]] = field(default_factory=list)
    session: str = ""

    def encode(self) -> bytes:
        items = [_PICK, self.address, self.placed, self.lora, self.keys, self.session]
        data: bytes = msgpack.packb(items)
        return data

    @classmethod
    def unpack(cls, data: bytes) -> SiblingPick:
        """From ``encode``'s bytes; ``ValueError`` (or ``TypeError``, or msgpack's) for others."""
        kind, *items = msgpack.unpackb(data)
        if kind != _PICK:
            raise ValueError(f"not a pick ({kind!r})")
        return cls.decode(items)

    @classmethod
    def decode(cls, items: list[Any]) -> SiblingPick:
        """From a datagram's items after the first; ``ValueError`` (or ``TypeError``) for
        items that are not a pick's (a replica that predates sessions sends none)."""
        address, placed, lora, keys, *session = items
        return cls(
            str(address),
            int(placed),
            None if lora is None else str(lora),
            [(int(tag), [int(k) for k in chain]) for tag, chain in keys],
            str(session[0]) if session else "",
        )


def encode_metrics(address: str, metrics: EndpointMetrics) -> bytes:
    """A datagram with ``address``'s scraped metrics (all but the time they were scraped)."""
    m = metrics
    items = [_METRICS, address, m.waiting, m.running, m.kv_usage, m.block_size]
    items += [m.num_gpu_blocks, sorted(m.running_loras), sorted(m.waiting_loras), m.max_loras]
    items += [m.token_gaps, m.token_gap_seconds]
    data: bytes = msgpack.packb(items)
    return data


def decode_metrics(items: list[Any]) -> tuple[str, EndpointMetrics]:
    """The address and metrics in a datagram's items after the first, scraped as of now."""
    address, waiting, running, usage, block_size, blocks, run, wait, max_loras, gaps, seconds = (
        items
    )
    return str(address), EndpointMetrics(
        waiting=int(waiting),
        running=int(running),
        kv_usage=float(usage),
        block_size=int(block_size),
        num_gpu_blocks=int(blocks),
        running_loras=frozenset(str(a) for a in run),
        waiting_loras=frozenset(str(a) for a in wait),
        max_loras=int(max_loras),
        token_gaps=float(gaps),
        token_gap_seconds=float(seconds),
        scraped_at=time.monotonic(),
    )


Receiver = Callable[[SiblingPick], None]
MetricsReceiver = Callable[[str, EndpointMetrics], None]


def exchange_directory() -> str:
    """A new directory for a gateway's workers' sockets: under the temporary directory, or
    under /tmp when that path is too long for a socket's (the caller removes it)."""
    base = tempfile.gettempdir()
    if len(base) > MAX_PATH - 40 and os.path.isdir("/tmp"):
        base = "/tmp"
    return tempfile.mkdtemp(prefix="kvgate-picks-", dir=base)


class PickExchange:
    """One worker's end: ``publish`` its picks and ``publish_metrics`` its scrapes;
    ``on_pick`` and ``on_metrics`` receive the others'."""

    def __init__(
        self, directory: str, on_pick: Receiver, on_metrics: MetricsReceiver | None = None
    ) -> None:
        self.directory = Path(directory)
        self.on_pick = on_pick
        self.on_metrics = on_metrics
        self.path = self.directory / f"{os.getpid()}-{next(_NUMBERS)}.sock"
        self.sent = self.received = self.dropped = 0
        self._sock: socket.socket | None = None
        self._peers: list[str] = []
        self._scanned = 0.0

    @classmethod
    def from_environment(
        cls, on_pick: Receiver, on_metrics: MetricsReceiver | None = None
    ) -> PickExchange | None:
        directory = os.environ.get(ENV)
        return cls(directory, on_pick, on_metrics) if directory else None

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
        if not self._peers or now - self._scanned >= RESCAN:
            self._scanned = now
            self._peers = [str(p) for p in self.directory.glob("*.sock") if p != self.path]
        return self._peers

    def publish(self, pick: SiblingPick) -> None:
        """Tell the other workers of ``pick``."""
        if self._sock is not None and (peers := self._others()):
            self._send(pick.encode(), peers)

    def publish_metrics(self, address: str, metrics: EndpointMetrics) -> None:
        """Tell the other workers what a scrape of ``address`` read."""
        if self._sock is not None and (peers := self._others()):
            self._send(encode_metrics(address, metrics), peers)

    def _send(self, data: bytes, peers: list[str]) -> None:
        assert self._sock is not None
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
                data, sender = self._sock.recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.debug("pick exchange: %s", exc)
                return
            try:
                kind, *items = msgpack.unpackb(data)
                if kind == _PICK:
                    pick, scraped = SiblingPick.decode(items), None
                elif kind == _METRICS:
                    pick, scraped = None, decode_metrics(items)
                else:
                    raise ValueError(f"a datagram of no known kind ({kind!r})")
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                log.debug("pick exchange: a malformed datagram (%s)", exc)
                continue
            if sender and sender not in self._peers:  # a sibling started since the last scan
                self._peers.append(sender)
            if pick is not None:
                self.on_pick(pick)
            elif scraped is not None and self.on_metrics is not None:
                self.on_metrics(*scraped)
            self.received += 1
