"""Buckets shared by every gateway replica in Redis, taken atomically by one Lua script.

The script reads the clock from Redis (``TIME``), so replicas with skewed clocks agree.
Every call is bounded by ``timeout``; a failure raises ``StoreUnavailable`` and marks the store
down. While down, requests skip Redis for ``retry_after_failure`` seconds at a time (so none
waits on a dead Redis twice); then the next request probes it. The store is up again only
when a call succeeds: its state follows real outcomes, not the clock.
"""

from __future__ import annotations

import asyncio
import logging
import time

import redis.asyncio as redis
from redis.exceptions import RedisError

from gateway.limits.buckets import BucketSpec, TakeResult

log = logging.getLogger("kvgate.gateway")

TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local force = ARGV[1] == '1'
local n = #KEYS
local levels = {}
local wait = 0
for i = 1, n do
  local cap = tonumber(ARGV[(i - 1) * 2 + 2])
  local cost = tonumber(ARGV[(i - 1) * 2 + 3])
  local rate = cap / 60
  local s = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local tokens = tonumber(s[1])
  local ts = tonumber(s[2])
  if tokens == nil then tokens = cap; ts = now end
  tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
  levels[i] = tokens
  if cost > 0 and tokens < cost then wait = math.max(wait, (cost - tokens) / rate) end
end
local allowed = force or wait == 0
local out = {allowed and 1 or 0, tostring(wait)}
for i = 1, n do
  local cap = tonumber(ARGV[(i - 1) * 2 + 2])
  local cost = tonumber(ARGV[(i - 1) * 2 + 3])
  local tokens = levels[i]
  if allowed then tokens = tokens - cost end
  redis.call('HSET', KEYS[i], 'tokens', tostring(math.min(tokens, cap)), 'ts', tostring(now))
  redis.call('EXPIRE', KEYS[i], 120)
  out[#out + 1] = tostring(tokens)
end
return out
"""


class StoreUnavailable(RuntimeError):
    """Redis did not answer in time (or at all)."""


class RedisStore:
    def __init__(
        self, url: str, timeout: float, retry_after_failure: float = 1.0, prefix: str = "kvgate:rl:"
    ) -> None:
        self.client = redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry_on_timeout=False,
        )
        self.timeout = timeout
        self.retry_after_failure = retry_after_failure
        self.prefix = prefix
        self.down_until = 0.0  # while down: no probe before this (monotonic)
        self.failures = 0
        self.up = True  # the last call succeeded (or none failed yet)
        self._script = self.client.register_script(TAKE)

    @property
    def is_up(self) -> bool:
        return self.up

    async def take(self, specs: list[BucketSpec], *, force: bool = False) -> TakeResult:
        if not self.up and time.monotonic() < self.down_until:
            raise StoreUnavailable("redis marked down after a recent failure")
        keys = [self.prefix + s.key for s in specs]
        args: list[str | int | float] = ["1" if force else "0"]
        for spec in specs:
            args += [spec.capacity, spec.cost]
        try:
            async with asyncio.timeout(self.timeout * 2):
                raw = await self._script(keys=keys, args=args)
        except (TimeoutError, RedisError, OSError) as exc:
            self.failures += 1
            self.up = False
            self.down_until = time.monotonic() + self.retry_after_failure
            log.warning(
                "redis limit store unavailable for %.1fs: %r", self.retry_after_failure, exc
            )
            raise StoreUnavailable(str(exc) or type(exc).__name__) from exc
        if not self.up:
            log.info("redis limit store is back")
        self.up = True
        allowed = int(raw[0]) == 1
        return TakeResult(
            allowed, 0.0 if allowed else float(raw[1]), tuple(float(v) for v in raw[2:])
        )

    async def close(self) -> None:
        await self.client.aclose()
