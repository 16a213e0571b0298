"""Admission by rate limits: reserve at admission, settle from the real usage at the end.

A request takes one unit from every matching rule's request bucket and its token estimate
(prompt characters / ``chars_per_token`` + ``max_tokens``) from every token bucket, all or
nothing. When the response ends, the difference between the real usage and the estimate is
refunded or charged (a charge may put a bucket in debt). With Redis down, ``fail_open``
enforces this replica's share of each limit in memory; ``fail_closed`` refuses with 503.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.errors import BadRequest, GatewayError
from gateway.identity import Identity
from gateway.limits.buckets import BucketSpec, MemoryStore, TakeResult, reset_seconds
from gateway.limits.redis_store import RedisStore, StoreUnavailable
from kvgate.wire.json_text import compact_json
from policies.schema import LimitRule, Limits

log = logging.getLogger("kvgate.gateway")


class RateLimited(GatewayError):
    status, type, code = 429, "rate_limit_error", "rate_limit_exceeded"


class NeverFits(GatewayError):
    """A request larger than a token bucket holds: it would wait forever (429, as OpenAI's
    "Request too large"; ``x-should-retry: false`` tells the official clients not to retry)."""

    status, type, code = 429, "rate_limit_error", "request_too_large"


class LimiterUnavailable(GatewayError):
    status, type, code = 503, "server_error", "rate_limiter_unavailable"


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``1s``, ``6m0s``, ``120ms``."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


@dataclass
class Reservation:
    token_specs: list[BucketSpec]
    estimate: int
    headers: dict[str, str] = field(default_factory=dict)


SETTLE_EVERY = 0.1  # seconds between batched settlements with Redis


class Limiter:
    """Reserves rate-limit buckets at admission and settles them from the real usage."""

    def __init__(self, limits: Limits, workers: int = 1) -> None:
        self.limits = limits
        store = limits.store
        self.primary: RedisStore | MemoryStore
        if store.kind == "redis" and store.url:
            self.primary = RedisStore(store.url, store.timeout)
        else:
            self.primary = MemoryStore(share=workers)
        self.fallback = MemoryStore(share=workers * store.replicas)
        self.store_errors = 0
        self.fallback_decisions = 0  # requests the local fallback decided (Redis down)
        self._settling: set[asyncio.Task[None]] = set()
        self._owed: dict[str, BucketSpec] = {}  # Redis: usage deltas not yet settled, by bucket
        self._flusher: asyncio.Task[None] | None = None
        # each rule's conditions in a fixed order, so the bucket key is the same every time
        self._conditions = [(rule, sorted(rule.match.items())) for rule in limits.rules]
        self.active = bool(limits.rules)  # any rule to enforce (read per request)

    @property
    def status(self) -> str:
        """``ok``, ``degraded`` (Redis down, enforcing locally) or ``down`` (refusing)."""
        if isinstance(self.primary, RedisStore) and not self.primary.is_up:
            return "degraded" if self.limits.store.on_failure == "fail_open" else "down"
        return "ok"

    def matching(
        self, identity: Identity | None, model: str, route: str
    ) -> list[tuple[LimitRule, str]]:
        values = {
            "tenant": identity.tenant if identity else "",
            "model": model,
            "route": route,
            "api_key": identity.principal if identity else "",
        }
        matched = []
        for rule, conditions in self._conditions:
            parts = []
            for name, wanted in conditions:
                actual = values.get(name, "")
                if wanted != "*" and wanted != actual:
                    break
                parts.append(f"{name}={actual}")
            else:
                matched.append((rule, "|".join(parts)))
        return matched

    def estimate(self, body: Mapping[str, object]) -> int:
        """Prompt characters / ``chars_per_token`` + the output the request may ask for;
        ``BadRequest`` for an output limit that is not a positive integer."""
        name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        out = body.get(name)
        if out is not None and (isinstance(out, bool) or not isinstance(out, int) or out < 1):
            raise BadRequest(f"{name} must be a positive integer; got {out!r}", param=name)
        max_tokens = out if isinstance(out, int) else self.limits.default_max_tokens
        text = body.get("messages") or body.get("prompt") or body.get("input") or ""
        chars = len(text) if isinstance(text, str) else len(compact_json(text))
        return chars // self.limits.chars_per_token + max_tokens

    async def reserve(
        self, identity: Identity | None, model: str, route: str, body: Mapping[str, object]
    ) -> Reservation | None:
        """Take this request's units, or raise ``RateLimited`` / ``LimiterUnavailable``."""
        rules = self.matching(identity, model, route)
        if not rules:
            return None
        estimate = self.estimate(body)
        request_specs = [
            BucketSpec(f"{r.name}:req:{k}", r.requests_per_min, 1)
            for r, k in rules
            if r.requests_per_min
        ]
        token_specs = [
            BucketSpec(f"{r.name}:tok:{k}", r.tokens_per_min, estimate)
            for r, k in rules
            if r.tokens_per_min
        ]
        for spec in token_specs:
            if estimate > spec.capacity:
                raise NeverFits(
                    f"Request too large for the {spec.key.split(':', 1)[0]} limit on tokens per "
                    f"minute: Limit {int(spec.capacity)}, Requested {estimate}. Send fewer "
                    "prompt tokens or a lower max_tokens.",
                    headers={"x-should-retry": "false"},
                )
        result = await self._take(request_specs + token_specs)
        headers = self._headers(request_specs, token_specs, result)
        if not result.allowed:
            retry = max(1, int(result.retry_after + 0.999))
            raise RateLimited(
                f"Rate limit reached; retry in {retry}s.",
                headers={**headers, "retry-after": str(retry)},
            )
        return Reservation(token_specs, estimate, headers)

    def settle(self, reservation: Reservation | None, actual_tokens: int | None) -> None:
        """Refund or charge the difference to the estimate: at once in memory; in Redis added
        up per bucket and sent every ``SETTLE_EVERY`` seconds (one script call for many
        requests, none on the request path)."""
        if reservation is None or actual_tokens is None or not reservation.token_specs:
            return
        delta = actual_tokens - reservation.estimate
        if delta == 0:
            return
        if isinstance(self.primary, MemoryStore):
            specs = [BucketSpec(s.key, s.capacity, delta) for s in reservation.token_specs]
            self.primary.take_now(specs, time.monotonic(), force=True)
            return
        for spec in reservation.token_specs:
            owed = self._owed.get(spec.key)
            total = delta + (owed.cost if owed is not None else 0)
            self._owed[spec.key] = BucketSpec(spec.key, spec.capacity, total)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._settle_soon())
            self._settling.add(self._flusher)
            self._flusher.add_done_callback(self._settling.discard)

    async def _settle_soon(self) -> None:
        await asyncio.sleep(SETTLE_EVERY)
        specs, self._owed = list(self._owed.values()), {}
        if specs:
            await self._settle(specs)

    async def _settle(self, specs: list[BucketSpec]) -> None:
        try:
            await self._take(specs, force=True)
        except LimiterUnavailable:
            log.warning("could not settle token usage: the limit store is down")

    async def _take(self, specs: list[BucketSpec], *, force: bool = False) -> TakeResult:
        if isinstance(self.primary, MemoryStore):
            return self.primary.take_now(specs, time.monotonic(), force=force)
        try:
            return await self.primary.take(specs, force=force)
        except StoreUnavailable as exc:
            self.store_errors += 1
            if self.limits.store.on_failure == "fail_closed":
                raise LimiterUnavailable(
                    "The rate limiter is unavailable; try again shortly."
                ) from exc
            self.fallback_decisions += 1
            return await self.fallback.take(specs, force=force)

    def _headers(
        self, request_specs: list[BucketSpec], token_specs: list[BucketSpec], result: TakeResult
    ) -> dict[str, str]:
        headers: dict[str, str] = {}
        remaining = iter(result.remaining)
        for kind, specs in (("requests", request_specs), ("tokens", token_specs)):
            levels = [(next(remaining), spec) for spec in specs]
            if not levels:
                continue
            level, spec = min(levels, key=lambda pair: pair[0] / pair[1].capacity)
            headers[f"x-ratelimit-limit-{kind}"] = str(int(spec.capacity))
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, int(level)))
            headers[f"x-ratelimit-reset-{kind}"] = duration(reset_seconds(level, spec))
        return headers

    async def close(self) -> None:
        for task in list(self._settling):
            await task
        if isinstance(self.primary, RedisStore):
            await self.primary.close()
