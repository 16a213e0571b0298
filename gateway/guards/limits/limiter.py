"""Admission by rate limits: reserve at admission, settle from the real usage at the end.

A request takes one unit from every matching rule's request bucket and its token estimate (the
prompt's UTF-8 bytes / ``chars_per_token`` + ``max_tokens``) from every token bucket, all or
nothing. Bytes, not characters: a byte-level BPE token covers a few bytes of any script, so a
CJK character (three bytes) counts as the few tokens it becomes, not a quarter of one. When the
response ends, the difference between the real usage and the estimate is refunded or charged (a
charge may put a bucket in debt). With Redis away, ``fail_open`` enforces this replica's share
of each limit in memory (``FallbackBuckets``), and what it admits is owed to Redis and sent when
Redis is back (``PendingUsage``), as are settlements that could not be sent; ``fail_closed``
refuses with 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gateway.base.errors import BadRequest, GatewayError
from gateway.base.identity import Identity
from gateway.guards.limits.buckets import BucketSpec, MemoryStore, TakeResult, reset_seconds
from gateway.guards.limits.budgets import budget_buckets, most_cost, refusal, remaining_header
from gateway.guards.limits.fallback import FallbackBuckets
from gateway.guards.limits.pending_usage import PendingUsage
from gateway.guards.limits.redis_store import RedisStore, StoreUnavailable
from kvgate.wire.json_text import compact_json
from kvgate.wire.output_limit import OUTPUT_LIMITS
from policies.schema import LimitRule, Limits
from policies.spend_section import Spend

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
    budget_specs: list[BucketSpec] = field(default_factory=list)
    cost: float = 0.0  # what the budgets were charged: the most the request may cost
    output_limit: int = 0  # the output tokens reserved for each of the request's samples


SETTLE_EVERY = 0.1  # seconds between batched settlements with Redis


class Limiter:
    """Reserves rate-limit buckets at admission and settles them from the real usage."""

    def __init__(self, limits: Limits, workers: int = 1, spend: Spend | None = None) -> None:
        """``spend``: the prices and budgets (budgets are kept in the limits' store)."""
        self.limits = limits
        self.spend = spend or Spend()
        store = limits.store
        self.primary: RedisStore | MemoryStore
        if store.kind == "redis" and store.url:
            patient = store.on_failure == "fail_closed"
            self.primary = RedisStore(store.url, store.timeout, patient=patient)
        else:
            self.primary = MemoryStore(share=workers)
        self.fallback = FallbackBuckets(share=workers * store.replicas)
        self.fallback_decisions = 0  # requests the local fallback decided (Redis away)
        self.pending = PendingUsage()  # usage owed to Redis, sent every SETTLE_EVERY
        self._flusher: asyncio.Task[None] | None = None
        # each rule's conditions in a fixed order, so the bucket key is the same every time
        self._conditions = [(rule, sorted(rule.match.items())) for rule in limits.rules]
        # any rule or budget to enforce (read per request)
        self.active = bool(limits.rules) or bool(self.spend.budgets)

    async def start(self) -> None:
        """Connect to the shared store before requests arrive (``fail_closed`` would refuse
        the first ones while connecting)."""
        if isinstance(self.primary, RedisStore) and self.active:
            await self.primary.start()

    @property
    def store_errors(self) -> int:
        """Calls to the shared store that failed or timed out."""
        return self.primary.failures if isinstance(self.primary, RedisStore) else 0

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

    def estimate(self, body: Mapping[str, object], context_length: int | None = None) -> int:
        """Prompt bytes / ``chars_per_token`` + the output the request may ask for, at most
        the model's ``context_length`` when known (no request can use more); ``BadRequest`` for
        an output limit that is not a positive integer."""
        prompt, output = self.estimate_parts(body, context_length)
        return prompt + output

    def estimate_parts(
        self,
        body: Mapping[str, object],
        context_length: int | None = None,
        prompt_tokens: int | None = None,
    ) -> tuple[int, int]:
        """``estimate``'s prompt and output tokens (the output of each of ``n`` samples);
        ``prompt_tokens``: the prompt as the engines' tokenizer counts it, where known."""
        name = next((name for name in OUTPUT_LIMITS if name in body), "max_tokens")
        out = body.get(name)
        if out is not None and (isinstance(out, bool) or not isinstance(out, int) or out < 1):
            raise BadRequest(f"{name} must be a positive integer; got {out!r}", param=name)
        max_tokens = out if isinstance(out, int) else self.limits.default_max_tokens
        prompt = self._prompt_estimate(body) if prompt_tokens is None else prompt_tokens
        if context_length is not None and prompt + max_tokens > context_length:
            prompt = min(prompt, context_length)
            max_tokens = context_length - prompt
        samples = body.get("n")  # each of n samples may write max_tokens
        if type(samples) is int and samples > 1:
            max_tokens *= samples
        return prompt, max_tokens

    def _prompt_estimate(self, body: Mapping[str, object]) -> int:
        text = body.get("messages") or body.get("prompt") or body.get("input") or ""
        # the system prompt of a Responses API request, or of an Anthropic Messages one
        system = body.get("instructions") or body.get("system")
        size = _utf8_length(text) + (_utf8_length(system) if system else 0)
        return size // self.limits.chars_per_token

    async def reserve(
        self,
        identity: Identity | None,
        model: str,
        route: str,
        body: Mapping[str, object],
        context_length: int | None = None,
        count_prompt: Callable[[], int | None] | None = None,
    ) -> Reservation | None:
        """Take this request's units, or raise ``RateLimited`` / ``LimiterUnavailable``;
        ``context_length``: the serving pool's ``max_model_len``, if set; ``count_prompt``:
        the prompt's tokens as the pool's tokenizer counts them, where one is known (asked
        only when a rule or budget applies)."""
        rules = self.matching(identity, model, route)
        if not rules and not self.spend.budgets:
            return None
        counted = count_prompt() if count_prompt is not None else None
        prompt, output = self.estimate_parts(body, context_length, counted)
        estimate = prompt + output
        cost, budgets = 0.0, []
        if self.spend.budgets:  # a policy of rate limits alone does none of this
            cost = most_cost(self.spend.prices.get(model), prompt, output)
            budgets = budget_buckets(self.spend, identity, cost, datetime.now(UTC))
            if not rules and not budgets:
                return None
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
        budget_specs = [bucket.spec for bucket in budgets]
        result = await self._take(request_specs + token_specs + budget_specs)
        headers = self._headers(request_specs, token_specs, result)
        budget_levels = result.remaining[len(result.remaining) - len(budgets) :]
        headers.update(remaining_header(budget_levels))
        if not result.allowed:
            spent = refusal(self.spend, budgets, budget_levels)
            if spent is not None:
                raise spent
            retry = max(1, int(result.retry_after + 0.999))
            raise RateLimited(
                f"Rate limit reached; retry in {retry}s.",
                headers={**headers, "retry-after": str(retry)},
            )
        samples = body.get("n")
        per_sample = output // samples if type(samples) is int and samples > 1 else output
        return Reservation(token_specs, estimate, headers, budget_specs, cost, per_sample)

    async def spend_remaining(self, identity: Identity | None) -> dict[str, str]:
        """``x-kvgate-spend-remaining`` for a caller whose request costs nothing (a cached
        answer): what its budgets have left, read without charging them ({} with none)."""
        if not self.spend.budgets:
            return {}
        budgets = budget_buckets(self.spend, identity, 0.0, datetime.now(UTC))
        if not budgets:
            return {}
        try:
            result = await self._take([bucket.spec for bucket in budgets])
        except LimiterUnavailable:
            return {}
        return remaining_header(result.remaining)

    def settle(
        self,
        reservation: Reservation | None,
        actual_tokens: int | None,
        actual_cost: float | None = None,
    ) -> None:
        """Refund or charge the difference to the estimate (tokens) and to the most it may
        cost (budgets; None: not known, the charge stands): at once in memory; to Redis added
        up per bucket and sent every ``SETTLE_EVERY`` seconds (one script call for many
        requests, none on the request path), kept until Redis takes it."""
        if reservation is None:
            return
        specs = []
        if actual_tokens is not None and actual_tokens != reservation.estimate:
            delta = actual_tokens - reservation.estimate
            specs += [s.costing(delta) for s in reservation.token_specs]
        if actual_cost is not None and actual_cost != reservation.cost:
            delta_cost = actual_cost - reservation.cost
            specs += [s.costing(delta_cost) for s in reservation.budget_specs]
        if not specs:
            return
        if isinstance(self.primary, MemoryStore):
            self.primary.take_now(specs, time.monotonic(), force=True)
            return
        if not self.primary.is_up:  # the fallback decides meanwhile: let it see the usage
            self.fallback.take(specs, time.monotonic(), force=True)
        self._owe(specs)

    def _owe(self, specs: list[BucketSpec]) -> None:
        self.pending.add(specs)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_pending())

    async def _flush_pending(self) -> None:
        assert isinstance(self.primary, RedisStore)
        while len(self.pending):
            await asyncio.sleep(SETTLE_EVERY)
            if self.primary.is_up:
                await self._settle(self.pending.drain())

    async def _settle(self, specs: list[BucketSpec]) -> None:
        """Send owed usage to Redis in one call; put it back if Redis does not take it."""
        if not specs:
            return
        try:
            await self._redis_take(specs, force=True)
        except StoreUnavailable as exc:
            self.pending.add(specs)  # sent again later, unless the late call was applied:
            self._if_applied(exc, specs)

    async def _redis_take(self, specs: list[BucketSpec], *, force: bool = False) -> TakeResult:
        """One call to Redis, each bucket seeded with the level last seen; the levels it
        answers are recorded for the fallback (``StoreUnavailable`` when it cannot answer)."""
        assert isinstance(self.primary, RedisStore)
        result = await self.primary.take(
            specs, self.fallback.seeds(specs, time.monotonic()), force=force
        )
        # the levels are Redis's at some moment of the call: dated at its answer, they refill
        # from the latest moment they could be from (a projection never hands out extra units)
        self.fallback.observe(specs, result, time.monotonic())
        return result

    async def _take(self, specs: list[BucketSpec]) -> TakeResult:
        if isinstance(self.primary, MemoryStore):
            return self.primary.take_now(specs, time.monotonic())
        try:
            return await self._redis_take(specs)
        except StoreUnavailable as exc:
            # a call that timed out may still be applied: Redis then took it for a request
            # refused here (undone), or for one the fallback admitted (owed once, not twice)
            self._if_applied(exc, specs)
            if self.limits.store.on_failure == "fail_closed":
                raise LimiterUnavailable(
                    "The rate limiter is unavailable; try again shortly."
                ) from exc
            self.fallback_decisions += 1
            result = self.fallback.take(specs, time.monotonic())
            if result.allowed:
                self._owe(specs)  # Redis learns of it when it is back
            return result

    def _if_applied(self, failure: StoreUnavailable, specs: list[BucketSpec]) -> None:
        """When the call that failed with ``failure`` is applied after all, owe Redis the
        opposite of ``specs``: what it took is already counted, or was not to be taken."""
        late = failure.answer
        if late is None:
            return
        undo = [s.costing(-s.cost) for s in specs]

        def applied(call: asyncio.Future[TakeResult]) -> None:
            if not call.cancelled() and call.exception() is None and call.result().allowed:
                self._owe(undo)

        late.add_done_callback(applied)

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
        """Send what is owed (if Redis takes it now) and close the connections."""
        if isinstance(self.primary, RedisStore):
            if self._flusher is not None and not self._flusher.done():
                self._flusher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._flusher
            if self.primary.is_up:
                await self._settle(self.pending.drain())
            if len(self.pending):
                log.warning("closing with usage of %d bucket(s) unsent", len(self.pending))
            await self.primary.close()


def _utf8_length(value: object) -> int:
    """The UTF-8 bytes of a prompt: a string, or any JSON value (messages, content parts)."""
    if isinstance(value, str):
        return len(value.encode())
    return len(compact_json(value).encode())
