"""Approximate prefix index: which endpoint probably holds which prefix, learned from the
picker's own decisions (of the model servers' answers it reads only their prompt tokens, to
know how much text their caches hold).

A request's routing text is cut into blocks of ``block_chars`` characters (a trailing partial
block included, at most ``max_blocks``) and chained with kvgate's block hash: block *i* is
xxh64 of chunk *i* seeded with the hash of block *i-1*, the chain rooted at ``xxh64(model)``
(GIE chains the same way, by concatenation).
Each endpoint keeps an LRU of the hashes routed to it, sized from its KV capacity; eviction
also removes it from the reverse map.

A chain is recorded tail first, so a block is always more recent than the blocks after it and
eviction takes tails before heads (as vLLM's block manager does): an endpoint that holds block
*i* of a chain holds blocks *0..i-1* too. ``match`` relies on that and finds each candidate's
depth by binary search, O(candidates * log blocks) instead of a walk over every block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from functools import partial

from epp.datalayer.indexes.chars_per_token import CharsPerToken
from epp.datalayer.indexes.prefix_index import (
    DEFAULT_CAPACITY,
    PrefixIndexParams,
    Undo,
    kv_capacity,
)
from epp.datalayer.routing_text import routing_text
from epp.framework import Endpoint, RequestMemo, SchedulingRequest
from kvgate.wire.block_hash import text_block_hashes


def prefix_hashes(model: str, text: str, block_chars: int, max_blocks: int) -> list[int]:
    """Chained block hashes of ``text`` (``kvgate.wire.block_hash``), rooted at the model name;
    empty if it is shorter than one block."""
    return text_block_hashes(text, block_chars, model, max_blocks)


class ApproximatePrefixIndex:
    """Block hashes per endpoint (an LRU each) and the reverse map from a hash to its holders."""

    def __init__(self) -> None:
        self._owners: dict[int, set[str]] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {}

    def __len__(self) -> int:
        return len(self._owners)

    def blocks_of(self, address: str) -> int:
        return len(self._lru.get(address, ()))

    def match(self, hashes: list[int], addresses: Iterable[str]) -> dict[str, int]:
        """Per address, how many leading blocks of the chain ``hashes`` it holds."""
        matched = dict.fromkeys(addresses, 0)
        held = self.held(hashes)
        matched.update((a, n) for a, n in held.items() if a in matched)
        return matched

    def held(self, hashes: list[int]) -> dict[str, int]:
        """How many leading blocks of the chain ``hashes`` each endpoint holding its first
        block holds (the others hold none): the cost grows with the holders, not the fleet."""
        matched: dict[str, int] = {}
        first = self._owners.get(hashes[0]) if hashes else None
        if not first:
            return matched
        owners_of = self._owners.get
        for address in first:
            low, high = 1, len(hashes)  # holds the first `low` blocks; not more than `high`
            while low < high:
                middle = (low + high + 1) // 2
                owners = owners_of(hashes[middle - 1])
                if owners is not None and address in owners:
                    low = middle
                else:
                    high = middle - 1
            matched[address] = low
        return matched

    def record(
        self, address: str, hashes: list[int], capacity: int = DEFAULT_CAPACITY
    ) -> list[int]:
        """Record that ``address`` holds the chain ``hashes``; the blocks it did not hold
        before (what ``forget_blocks`` takes back if the endpoint never got the request)."""
        lru = self._lru.setdefault(address, OrderedDict())
        added: list[int] = []
        for block in reversed(hashes):  # tail first: each block's prefix stays more recent
            if block in lru:
                lru.move_to_end(block)
            else:
                lru[block] = None
                added.append(block)
                self._owners.setdefault(block, set()).add(address)
        self.trim(address, capacity)
        return added

    def trim(self, address: str, capacity: int) -> None:
        """Evict ``address``'s least recent blocks until it holds at most ``capacity``."""
        lru = self._lru.get(address)
        if lru is None:
            return
        while len(lru) > max(capacity, 1):
            evicted, _ = lru.popitem(last=False)
            owners = self._owners.get(evicted)
            if owners is not None:
                owners.discard(address)
                if not owners:
                    del self._owners[evicted]

    def forget_blocks(self, address: str, blocks: list[int]) -> None:
        """Take back ``blocks`` recorded for ``address`` (those still there)."""
        lru = self._lru.get(address)
        if lru is None:
            return
        for block in blocks:
            if lru.pop(block, 0) is None:
                owners = self._owners.get(block)
                if owners is not None:
                    owners.discard(address)
                    if not owners:
                        del self._owners[block]

    def remove(self, address: str) -> None:
        """Forget an endpoint (gone, or restarted with an empty cache)."""
        for block in self._lru.pop(address, ()):
            owners = self._owners.get(block)
            if owners is not None:
                owners.discard(address)
                if not owners:
                    del self._owners[block]


class ApproximatePrefixCache:
    """``PrefixIndex`` learned from the picker's decisions: blocks are ``block_size_tokens x
    chars_per_token`` characters of the routing text; each endpoint's LRU is sized from its
    KV capacity (``num_gpu_blocks``) when scraped, in characters by the ratio the endpoint's
    answers show (``CharsPerToken``; the configured ``chars_per_token`` until measured)."""

    def __init__(self, params: PrefixIndexParams) -> None:
        self.params = params
        self.index = ApproximatePrefixIndex()
        self._block_chars = params.block_size_tokens * params.chars_per_token
        self._memo: RequestMemo[list[int]] = RequestMemo()
        self.chars_per_token = CharsPerToken()
        self._chars: RequestMemo[int] = RequestMemo()

    @property
    def routing_limit(self) -> int:
        return self._block_chars * self.params.max_prefix_blocks

    def keys(self, request: SchedulingRequest) -> list[int]:
        keys = self._memo.get(request)
        if keys is None:
            text = request.routing_text
            keys = prefix_hashes(
                request.model, text, self._block_chars, self.params.max_prefix_blocks
            )
            keys = self._memo.put(request, keys)
        return keys

    def match(self, keys: list[int], addresses: Iterable[str]) -> dict[str, int]:
        return self.index.match(keys, addresses)

    def prompt_tokens(self, request: SchedulingRequest) -> int:
        return self._prompt_chars(request) // self.params.chars_per_token

    def uncached_tokens(self, request: SchedulingRequest, endpoint: Endpoint) -> int:
        return self.uncached_tokens_each(request, [endpoint])[0]

    def holders(self, request: SchedulingRequest, limit: int) -> list[str]:
        held = self.index.held(self.keys(request))
        return sorted(held, key=held.__getitem__, reverse=True)[:limit]

    def uncached_tokens_each(
        self, request: SchedulingRequest, endpoints: list[Endpoint]
    ) -> list[int]:
        keys = self.keys(request)
        matched = self.index.held(keys) if keys else {}
        chars, block = self._prompt_chars(request), self._block_chars
        ratio_of, default = self.chars_per_token.of, self.params.chars_per_token
        return [
            int(
                max(0, chars - matched.get(e.address, 0) * block) / (ratio_of(e.address) or default)
            )
            for e in endpoints
        ]

    def _prompt_chars(self, request: SchedulingRequest) -> int:
        """The whole request's routing text length (the routing text is cut to what the index
        hashes), worked out once per request."""
        chars = self._chars.get(request)
        if chars is None:
            text = routing_text(request.body) if request.body else request.routing_text
            chars = self._chars.put(request, len(text))
        return chars

    def learn(self, request: SchedulingRequest, endpoint: Endpoint) -> Undo:
        return self.learn_keys(self.keys(request), endpoint)

    def learn_keys(self, keys: list[int], endpoint: Endpoint) -> Undo:
        if not keys:
            return None
        added = self.index.record(endpoint.address, keys, self._capacity(endpoint))
        return partial(self.index.forget_blocks, endpoint.address, added) if added else None

    def _capacity(self, endpoint: Endpoint) -> int:
        return self.capacity_of(endpoint) or self.params.lru_capacity_per_endpoint

    def observe_usage(self, request: SchedulingRequest, endpoint: Endpoint, tokens: int) -> None:
        if not self.params.measure_chars_per_token:
            return
        self.chars_per_token.observe(endpoint.address, self._prompt_chars(request), tokens)
        self.index.trim(endpoint.address, self._capacity(endpoint))

    def capacity_of(self, endpoint: Endpoint) -> int:
        tokens_held = kv_capacity(endpoint, self.params.block_size_tokens)
        measured = self.chars_per_token.of(endpoint.address)
        if measured is None or not tokens_held:
            return tokens_held
        return max(1, round(tokens_held * measured / self.params.chars_per_token))

    def blocks_of(self, address: str) -> int:
        return self.index.blocks_of(address)

    def forget(self, address: str) -> None:
        self.index.remove(address)
        self.chars_per_token.forget(address)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None
