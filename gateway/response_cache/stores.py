"""Where kept answers live: this process's memory (least recently used first out, each answer
until its expiry) and, for replicas that share them, Redis.

Redis is asked within ``timeout``; a call that fails or times out is a miss (or a write not
made), never a failed request, and several in a row take Redis down (``StoreHealth``): while
down, only a probe call a second goes to it, and the memory store answers alone.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as redis
from cachetools import TLRUCache
from redis.exceptions import RedisError

from kvgate.wire.store_health import StoreHealth

log = logging.getLogger("kvgate.gateway")

PROBE_INTERVAL = 1.0  # seconds between calls to a Redis that is down
MAX_WRITES = 64  # Redis writes in flight; more answers are kept in memory only
_HEAD = struct.Struct(">?dd")  # stream, stored at, expires at (wall clock)
KEY_PREFIX = "kvgate:response:"


@dataclass(frozen=True, slots=True)
class KeptAnswer:
    """One answer as the client got it: a JSON body, or a whole SSE stream."""

    body: bytes
    stream: bool
    stored_at: float  # wall clock
    expires_at: float

    def encode(self) -> bytes:
        return _HEAD.pack(self.stream, self.stored_at, self.expires_at) + self.body

    @classmethod
    def decode(cls, data: bytes) -> KeptAnswer | None:
        """The answer in ``data``; None when it is not one (another writer's key)."""
        if len(data) < _HEAD.size:
            return None
        stream, stored_at, expires_at = _HEAD.unpack_from(data)
        return cls(data[_HEAD.size :], stream, stored_at, expires_at)


def _expiry(key: str, answer: KeptAnswer, now: float) -> float:
    """When ``answer`` expires on the memory store's (monotonic) clock."""
    return now + (answer.expires_at - time.time())


class _Answers(TLRUCache[str, KeptAnswer]):
    """cachetools' time-aware LRU, counting the answers pushed out for room."""

    evictions = 0

    def popitem(self) -> tuple[str, KeptAnswer]:
        self.evictions += 1
        return super().popitem()


class MemoryAnswers:
    """This process's answers, at most ``max_bytes`` of them."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._answers = _Answers(max_bytes, _expiry, getsizeof=lambda answer: len(answer.body))

    def get(self, key: str) -> KeptAnswer | None:
        return self._answers.get(key)

    def put(self, key: str, answer: KeptAnswer) -> None:
        if answer.expires_at > time.time():
            self._answers[key] = answer

    @property
    def bytes(self) -> int:
        return int(self._answers.currsize)

    @property
    def evictions(self) -> int:
        return self._answers.evictions


class RedisAnswers:
    """Answers every replica finds, under ``kvgate:response:<key>``, expiring in Redis."""

    def __init__(self, url: str, timeout: float, on_failure: Callable[[], None]) -> None:
        """``on_failure`` is called for every call that failed or timed out."""
        self.url = url
        self.on_failure = on_failure
        self.timeout = timeout
        self.client = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self.health = StoreHealth("the response cache's Redis")
        self._next_probe = 0.0
        self._writes: set[asyncio.Task[None]] = set()

    async def get(self, key: str) -> KeptAnswer | None:
        if not self._callable():
            return None
        try:
            async with asyncio.timeout(self.timeout):
                data = await self.client.get(KEY_PREFIX + key)
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)
            return None
        self.health.succeeded()
        return KeptAnswer.decode(data) if isinstance(data, bytes) else None

    def put(self, key: str, answer: KeptAnswer) -> None:
        """Write ``answer`` in the background (the client's response does not wait for it)."""
        if len(self._writes) >= MAX_WRITES or not self._callable():
            return
        task = asyncio.create_task(self._put(key, answer))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _put(self, key: str, answer: KeptAnswer) -> None:
        ttl_ms = int((answer.expires_at - time.time()) * 1000)
        if ttl_ms <= 0:
            return
        try:
            async with asyncio.timeout(self.timeout):
                await self.client.set(KEY_PREFIX + key, answer.encode(), px=ttl_ms)
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)
            return
        self.health.succeeded()

    def _callable(self) -> bool:
        """Whether to call Redis now: while it is up, or for a probe a second while down."""
        if self.health.up:
            return True
        now = time.monotonic()
        if now < self._next_probe:
            return False
        self._next_probe = now + PROBE_INTERVAL
        return True

    def _failed(self, exc: BaseException) -> None:
        self.on_failure()
        self.health.failed(str(exc) or type(exc).__name__)

    async def close(self) -> None:
        for task in list(self._writes):
            task.cancel()
        await self.client.aclose()
