"""An automatic canary's state (or the model registry's stages) in Redis, for gateways whose
limits already share a Redis: every replica (and every worker of each) routes by the same
saved state, and one of them judges a canary, the holder of a lease that it renews every tick
and that lapses ``JUDGE_LEASE`` seconds after its holder stops.

A change is a compare-and-set (``WATCH`` / ``MULTI``), retried when another replica changed
the state in between. Redis errors become ``StateUnavailable`` (an ``OSError``): the canaries
then keep routing by the state they last read, and judge nothing, until Redis answers again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Generic

import redis
from redis.exceptions import RedisError, WatchError

from gateway.control.canary.state import S, apply_change, parse_saved

JUDGE_LEASE = 10.0  # seconds
TIMEOUT = 0.5  # seconds per Redis call (the canaries' clock runs off the event loop)
RETRIES = 5

# take the lease if it is free, renew it if it is ours
CLAIM = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class StateUnavailable(OSError):
    """Redis could not be read or written."""


class RedisStateStore(Generic[S]):
    """One state under ``key`` (``kvgate:canary:<model>`` for a canary, with its judge's
    lease); ``parse`` reads what ``to_json`` wrote."""

    def __init__(self, url: str, key: str, parse: Callable[[str], S]) -> None:
        self.client = redis.Redis.from_url(
            url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT
        )
        self.key = key
        self.parse = parse
        self.what = f"{key.split(':')[1]} state" if key.count(":") >= 2 else key  # in errors
        self.judge_key = f"{self.key}:judge"
        self.identity = uuid.uuid4().hex
        self._judge = False

    def load(self) -> S | None:
        try:
            text = self.client.get(self.key)
        except RedisError as exc:
            raise StateUnavailable(f"{self.what} in Redis: {exc}") from exc
        return self._parse(text)

    def _parse(self, value: object) -> S | None:
        if isinstance(value, bytes):
            value = value.decode()
        if not isinstance(value, str) or not value:
            return None
        return parse_saved(self.parse, value, self.key)

    def update(self, change: Callable[[S | None], S | None]) -> S | None:
        try:
            for _ in range(RETRIES):
                with self.client.pipeline() as pipe:
                    try:
                        pipe.watch(self.key)  # type: ignore[no-untyped-call]
                        changed, write = apply_change(self._parse(pipe.get(self.key)), change)
                        pipe.multi()
                        if changed is not None and write:
                            pipe.set(self.key, changed.to_json())
                        pipe.execute()
                        return changed
                    except WatchError:
                        continue
        except RedisError as exc:
            raise StateUnavailable(f"{self.what} in Redis: {exc}") from exc
        raise StateUnavailable(f"{self.what} in Redis: changed {RETRIES} times while writing")

    def is_judge(self) -> bool:
        try:
            claimed = self.client.eval(
                CLAIM, 1, self.judge_key, self.identity, int(JUDGE_LEASE * 1000)
            )
        except RedisError:
            self._judge = False
            return False  # no lease can be known: nobody here judges
        self._judge = claimed == 1
        return self._judge

    def close(self) -> None:
        try:
            if self._judge:
                self.client.eval(RELEASE, 1, self.judge_key, self.identity)
        except RedisError:
            pass  # the lease lapses on its own
        self._judge = False
        self.client.close()
