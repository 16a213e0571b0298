"""``PrefixIndex`` from the engines' own KV events: the precise index, its KV-event subscriber
and the tokenizer that cuts a request into the same blocks the engine caches."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from epp.datalayer.indexes.precise import KVEventHooks, PreciseIndex, block_keys
from epp.datalayer.indexes.prefix_index import (
    PrefixIndexParams,
    Undo,
    kv_capacity,
)
from epp.datalayer.kv_events import KVEventSubscriber
from epp.datalayer.tokenize import make_tokenizer, request_token_ids
from epp.framework import Endpoint, RequestMemo, SchedulingRequest


class PrecisePrefixCache:
    """The request is tokenized as the backend does (``tokenizer``: ``byte`` or an HF
    ``tokenizer.json``) and cut into ``block_size_tokens`` blocks, matched against the blocks
    the engines reported; a pick is held speculatively for ``speculative_ttl`` seconds, until
    the engine's own events arrive. Raises ``ValueError`` for a tokenizer it cannot load."""

    def __init__(
        self,
        params: PrefixIndexParams,
        endpoints: list[Endpoint],
        hooks: KVEventHooks | None = None,
    ) -> None:
        self.params = params
        tiers = {"CPU": params.cpu_tier_weight, "STORAGE": params.storage_tier_weight}
        self.index = PreciseIndex(params.speculative_ttl, hooks, tiers)
        self.events = KVEventSubscriber(self.index, endpoints)
        self._tokenizer = make_tokenizer(params.tokenizer)
        self._memo: RequestMemo[list[int]] = RequestMemo()
        self._tokens: RequestMemo[list[int]] = RequestMemo()
        self._started = False

    @property
    def routing_limit(self) -> int:
        return 0  # the body is tokenized; no routing text is read

    def token_ids(self, request: SchedulingRequest) -> list[int]:
        """The prompt's token ids as the engines compute them (worked out once a request)."""
        tokens = self._tokens.get(request)
        if tokens is None:
            tokens = self._tokens.put(request, request_token_ids(request.body, self._tokenizer))
        return tokens

    def keys(self, request: SchedulingRequest) -> list[int]:
        keys = self._memo.get(request)
        if keys is None:
            p = self.params
            salt = request.body.get("cache_salt")
            keys = block_keys(
                self.token_ids(request),
                p.block_size_tokens,
                request.lora,
                max_blocks=p.max_prefix_blocks,
                cache_salt=salt if isinstance(salt, str) else None,
            )
            keys = self._memo.put(request, keys)
        return keys

    def match(self, keys: list[int], addresses: Iterable[str]) -> dict[str, float]:
        return self.index.match(keys, addresses)

    def prompt_tokens(self, request: SchedulingRequest) -> int:
        return len(self.token_ids(request))

    def uncached_tokens(self, request: SchedulingRequest, endpoint: Endpoint) -> int:
        return self.uncached_tokens_each(request, [endpoint])[0]

    def holders(self, request: SchedulingRequest, limit: int) -> list[str]:
        keys = self.keys(request)
        if not keys:
            return []
        held = self.index.match(keys, self.index.holders_of(keys[0]))
        return sorted(held, key=held.__getitem__, reverse=True)[:limit]

    def uncached_tokens_each(
        self, request: SchedulingRequest, endpoints: list[Endpoint]
    ) -> list[int]:
        keys = self.keys(request)
        matched = self.index.match(keys, [e.address for e in endpoints]) if keys else {}
        total, size = self.prompt_tokens(request), self.params.block_size_tokens
        return [max(0, round(total - matched.get(e.address, 0) * size)) for e in endpoints]

    def learn(self, request: SchedulingRequest, endpoint: Endpoint) -> Undo:
        return self.learn_keys(self.keys(request), endpoint)

    def learn_keys(self, keys: list[int], endpoint: Endpoint) -> Undo:
        if not keys:
            return None
        added = self.index.record_speculative(endpoint.address, keys)
        return partial(self.index.forget_speculative, endpoint.address, added) if added else None

    def blocks_of(self, address: str) -> int:
        return self.index.blocks_of(address)

    def observe_usage(self, request: SchedulingRequest, endpoint: Endpoint, tokens: int) -> None:
        return None  # it tokenizes the prompt itself

    def capacity_of(self, endpoint: Endpoint) -> int:
        return kv_capacity(endpoint, self.params.block_size_tokens)

    def forget(self, address: str) -> None:
        self.index.clear(address)

    async def start(self) -> None:
        if not self._started:
            self._started = True
            await self.events.start()

    async def stop(self) -> None:
        if self._started:
            self._started = False
            await self.events.stop()
