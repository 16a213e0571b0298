"""Buckets shared by every gateway replica in Redis, taken atomically by one Lua script.

The script reads the clock from Redis (``TIME``), so replicas with skewed clocks agree, and
answers with it to the microsecond (``tostring`` would round it to 100 µs, and answers that tie
cannot be ordered). A bucket Redis does not hold (a restarted Redis without persistence, or a
first use) starts from the ``seed`` the caller passes, the level this replica last saw
projected to now, else full: a Redis restart does not hand every tenant a fresh minute.

Every call is bounded by ``timeout`` on the event loop, extended while the loop itself is late
(``within``), and by ten times that (at least 250 ms) when the caller would rather wait than
refuse (``patient``: fail_closed). A call that timed out is left running until then: its late
answer is handed to the caller, which may have decided without it. A failed call raises
``StoreUnavailable``; several in a row take the store down (``StoreHealth``). While down, calls
fail at once without touching the network, the idle pooled connections are dropped (a restarted
Redis leaves them stale), and a probe every ``probe_interval`` brings the store back on its
first success.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.guards.limits.buckets import BucketSpec, TakeResult
from gateway.guards.limits.loop_deadline import within
from kvgate.wire.store_health import StoreHealth

log = logging.getLogger("kvgate.gateway")

TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local force = ARGV[1] == '1'
local n = #KEYS
local levels = {}
local wait = 0
local never = false
for i = 1, n do
  local at = (i - 1) * 5
  local cap = tonumber(ARGV[at + 2])
  local cost = tonumber(ARGV[at + 3])
  local rate = tonumber(ARGV[at + 5])
  local s = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local tokens = tonumber(s[1])
  local ts = tonumber(s[2])
  if tokens == nil then tokens = tonumber(ARGV[at + 4]) or cap; ts = now end
  tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
  levels[i] = tokens
  if cost > 0 and tokens < cost then
    if rate > 0 then wait = math.max(wait, (cost - tokens) / rate) else never = true end
  end
end
local allowed = force or (wait == 0 and not never)
if never then wait = -1 end
local stamp = string.format('%.6f', now)
local out = {allowed and 1 or 0, tostring(wait), stamp}
for i = 1, n do
  local at = (i - 1) * 5
  local cap = tonumber(ARGV[at + 2])
  local cost = tonumber(ARGV[at + 3])
  local tokens = levels[i]
  if allowed then tokens = tokens - cost end
  redis.call('HSET', KEYS[i], 'tokens', tostring(math.min(tokens, cap)), 'ts', stamp)
  redis.call('EXPIRE', KEYS[i], tonumber(ARGV[at + 6]))
  out[#out + 1] = tostring(tokens)
end
return out
"""

WARM_CONNECTIONS = 8  # opened before the gateway serves, so its first requests do not connect


class StoreUnavailable(RuntimeError):
    """Redis did not answer in time (or at all), or is marked down. ``answer``: a call that
    timed out but is still running; it may yet be applied, and resolves to Redis's result (or
    fails, or is cancelled at the store's patience)."""

    def __init__(self, reason: str, answer: asyncio.Future[TakeResult] | None = None) -> None:
        super().__init__(reason)
        self.answer = answer


class RedisStore:
    def __init__(
        self,
        url: str,
        timeout: float,
        *,
        patient: bool = False,
        probe_interval: float = 0.25,
        prefix: str = "kvgate:rl:",
    ) -> None:
        self.timeout = timeout
        self.patience = max(10 * timeout, 0.25)  # the longest a call waits on a late loop
        # a patient caller (fail_closed: the alternative is refusing) waits for the answer
        # until the patience runs out; others decide without it once the timeout passes
        self.deadline = self.patience if patient else timeout
        self.client = redis.Redis.from_url(
            url,
            socket_timeout=self.patience,
            socket_connect_timeout=self.patience,
            # one immediate retry: a pooled connection that went stale gets a fresh one
            retry=Retry(NoBackoff(), 1),
        )
        self.probe_interval = probe_interval
        self.prefix = prefix
        self.health = StoreHealth("redis limit store")
        self._script = self.client.register_script(TAKE)
        self._probe: asyncio.Task[None] | None = None

    @property
    def is_up(self) -> bool:
        return self.health.up

    @property
    def failures(self) -> int:
        return self.health.failures

    async def start(self, budget: float = 2.0) -> None:
        """Open a few connections and load the script before the gateway serves; a Redis that
        cannot be reached within ``budget`` seconds leaves the store down (and probed)."""
        try:
            async with asyncio.timeout(budget):
                await asyncio.gather(*(self.client.ping() for _ in range(WARM_CONNECTIONS)))
                await self.client.script_load(TAKE)
        except Exception as exc:  # whatever it is, the store is not there
            self._failed(exc, conclusive=True)
            return
        self.health.succeeded()

    async def take(
        self, specs: list[BucketSpec], seeds: list[float | None], *, force: bool = False
    ) -> TakeResult:
        """Take every spec's cost, all or nothing (``force``: always, into debt if need be);
        ``seeds[i]`` is where a bucket Redis does not hold starts."""
        if not self.health.up:
            raise StoreUnavailable("redis is marked down; a probe will find it again")
        keys = [self.prefix + s.key for s in specs]
        args: list[str | int | float] = ["1" if force else "0"]
        for spec, seed in zip(specs, seeds, strict=True):
            args += [spec.capacity, spec.cost, "" if seed is None else seed, spec.rate, spec.ttl]
        call = asyncio.ensure_future(self._call(keys, args))
        try:
            return await within(call, self.deadline, self.patience, keep_running=True)
        except TimeoutError as exc:
            self._failed(exc)
            late = None if call.done() else call
            if late is not None:
                late.add_done_callback(self._late_answer)
            raise StoreUnavailable(str(exc), late) from exc
        except Exception as exc:  # any failure of the store is the store's, never the request's
            self._failed(exc)
            raise StoreUnavailable(str(exc) or type(exc).__name__) from exc

    async def _call(self, keys: list[str], args: list[str | int | float]) -> TakeResult:
        raw = await self._script(keys=keys, args=args)
        self.health.succeeded()
        allowed = int(raw[0]) == 1
        wait = float(raw[1])  # -1: a bucket that never refills cannot pay
        return TakeResult(
            allowed,
            0.0 if allowed else math.inf if wait < 0 else wait,
            tuple(float(v) for v in raw[3:]),
            float(raw[2]),
        )

    def _late_answer(self, call: asyncio.Future[TakeResult]) -> None:
        if not call.cancelled():
            call.exception()  # retrieved: a late failure was counted when it timed out

    def _failed(self, exc: BaseException, *, conclusive: bool = False) -> None:
        if self.health.failed(repr(exc), conclusive=conclusive):
            self._probe = asyncio.create_task(self._probe_until_up())

    async def _probe_until_up(self) -> None:
        # every pooled connection may be stale (a restarted Redis): start over with new ones
        with contextlib.suppress(RedisError, OSError):
            await self.client.connection_pool.disconnect(inuse_connections=False)
        while not self.health.up:
            await asyncio.sleep(self.probe_interval)
            try:
                await within(self.client.ping(), self.timeout, self.patience)
            except (TimeoutError, RedisError, OSError):
                continue
            self.health.succeeded()

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        await self.client.aclose()
