"""Picks shared between picker replicas on any host (``epp.replicas``), through a Redis stream,
so that replicas behind a load balancer route as one: a prefix one replica placed is warm for
all, instead of being placed once per replica.

Each pick (``SiblingPick``: the endpoint, its placed tokens and LoRA adapter, the request's
block keys in each prefix index, its session) goes into the stream with the others made since
the last round trip: one entry a round trip (up to ``BATCH`` picks; a reader's cost is mostly
per entry, ``bench.shared_view``), tagged with the replica that made them. Every replica reads
the stream from its start (``XREAD``): what the stream still holds (the last ``history``
entries) is how a replica that starts, restarts or was cut off catches up,
and from there on it follows the others' picks as they come. ``start`` waits for that catch-up,
briefly (``CATCH_UP``), so a replica's first picks already know where the others placed what.

Sharing never holds a request back: ``publish`` queues the pick (at most ``QUEUE`` of them),
and one task sends what has queued in one pipelined round trip. When Redis cannot be reached,
or does not answer within ``timeout``, the replica routes on what it knows (its own picks),
says so (``shared`` is false: ``/readyz`` and ``kvgate_epp_shared_view_up``), keeps the
latest picks queued, and tries again, backing off to ``MAX_RETRY``; once back, it reads
what it missed and sends what it kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgpack
import redis.asyncio as redis
from redis.exceptions import RedisError

from epp.requestcontrol.pick_exchange import SiblingPick
from kvgate.wire.store_health import StoreHealth
from policies.schema import Replicas

log = logging.getLogger("kvgate.epp")

BLOCK = 1.0  # seconds a read waits for new picks
PAGE = 500  # entries per read
QUEUE = 5_000  # picks kept while the store cannot take them (the oldest dropped first)
BATCH = 256  # picks per round trip
RETRY = 0.25  # seconds before the first try after a failure; doubles up to MAX_RETRY
MAX_RETRY = 2.0
CATCH_UP = 2.0  # seconds ``start`` waits for the history to be read
FAILURES = (RedisError, OSError, TimeoutError)

# a pick and how long ago (seconds) it was made: a replica catching up learns old picks too
PickReceiver = Callable[[SiblingPick, float], None]


class SharedPicks:
    """One replica's end of the shared stream: ``publish`` its picks; ``on_pick`` receives the
    other replicas' (and, on catch-up, this replica's earlier lives')."""

    def __init__(self, settings: Replicas, on_pick: PickReceiver) -> None:
        self.settings = settings
        self.on_pick = on_pick
        self.replica = os.urandom(8)  # this picker's tag: its own picks are not learned twice
        self.health = StoreHealth(f"the shared pick stream ({settings.key})", failures_to_down=1)
        self.sent = self.received = self.dropped = 0
        self.caught_up = asyncio.Event()
        self._queue: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._client: redis.Redis | None = None

    @property
    def shared(self) -> bool:
        """Whether this replica's view is shared (the store answers), rather than local only."""
        return self.health.up

    async def start(self) -> None:
        """Connect, read what the stream holds (waiting at most ``CATCH_UP``), and follow it.
        A store that cannot be reached leaves the replica starting cold, and saying so."""
        timeout = self.settings.timeout
        self._client = redis.Redis.from_url(
            self.settings.store,
            socket_timeout=BLOCK + timeout,
            socket_connect_timeout=timeout,
        )
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._follow()), loop.create_task(self._send())]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CATCH_UP):
                await self.caught_up.wait()
        if not self.caught_up.is_set():
            log.warning(
                "starting cold: the shared picks (%s at %s) were not read within %.0fs; "
                "routing on this replica's own picks until they are",
                self.settings.key,
                self.settings.store,
                CATCH_UP,
            )

    async def stop(self) -> None:
        for task in self._tasks:
            # redis-py can swallow a cancellation that lands mid-command: cancel until done
            while not task.done():
                task.cancel()
                await asyncio.wait([task], timeout=0.05)
        self._tasks = []
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def publish(self, pick: SiblingPick) -> None:
        """Queue ``pick`` for the other replicas; never waits."""
        if len(self._queue) >= QUEUE:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(pick.encode())
        self._wake.set()

    async def _send(self) -> None:
        delay = RETRY
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
                try:
                    await self._append(batch)
                except FAILURES as exc:
                    self._failed(exc)
                    kept = batch[max(0, len(batch) + len(self._queue) - QUEUE) :]
                    self.dropped += len(batch) - len(kept)
                    self._queue.extendleft(reversed(kept))
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, MAX_RETRY)
                    continue
                self.sent += len(batch)
                self.health.succeeded()
                delay = RETRY

    async def _append(self, batch: list[bytes]) -> None:
        """One stream entry for the whole batch: a reader parses one entry, not hundreds."""
        assert self._client is not None
        fields: dict[Any, Any] = {"r": self.replica, "b": msgpack.packb(batch)}
        async with asyncio.timeout(self.settings.timeout):
            await self._client.xadd(
                self.settings.key, fields, maxlen=self.settings.history, approximate=True
            )

    async def _follow(self) -> None:
        """Read the stream from its start, then as it grows; on failure, back off and resume
        after the last entry read."""
        assert self._client is not None
        last: bytes | str = "0-0"
        delay = RETRY
        while True:
            try:
                async with asyncio.timeout(BLOCK + self.settings.timeout):
                    reply: Any = await self._client.xread(
                        {self.settings.key: last}, count=PAGE, block=int(BLOCK * 1000)
                    )
            except FAILURES as exc:
                self._failed(exc)
                await asyncio.sleep(delay)
                delay = min(2 * delay, MAX_RETRY)
                continue
            self.health.succeeded()
            delay = RETRY
            entries = _entries(reply)
            if entries:
                last = entries[-1][0]
                self._learn(entries)
            if len(entries) < PAGE:
                self.caught_up.set()

    def _learn(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        now_ms = time.time() * 1000
        for entry_id, fields in entries:
            if fields.get(b"r") == self.replica:
                continue
            try:  # a batch of picks ("b"), or one (a replica of an earlier version: "p")
                batch = msgpack.unpackb(fields[b"b"]) if b"b" in fields else [fields[b"p"]]
                picks = [SiblingPick.unpack(data) for data in batch]
            except (KeyError, ValueError, TypeError, msgpack.UnpackException) as exc:
                log.debug("shared picks: a malformed entry %r (%s)", entry_id, exc)
                continue
            age = max(0.0, now_ms - int(entry_id.split(b"-", 1)[0])) / 1000
            for pick in picks:
                self.on_pick(pick, age)
            self.received += len(picks)

    def _failed(self, exc: BaseException) -> None:
        if self.health.failed(str(exc) or type(exc).__name__):
            log.warning("routing on this replica's own picks until the stream is back")


def _entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The entries of one stream's ``XREAD`` reply: ``[[key, entries]]`` (RESP2) or
    ``{key: entries}`` (RESP3); empty for none."""
    if not reply:
        return []
    streams = list(reply.values()) if isinstance(reply, dict) else [s[1] for s in reply]
    entries: list[tuple[bytes, dict[bytes, bytes]]] = streams[0]
    return entries
