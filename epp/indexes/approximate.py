"""Approximate prefix index: which endpoint probably holds which prefix, learned from the
picker's own decisions (no feedback from the model servers).

A request's routing text is cut into blocks of ``block_chars`` characters (a trailing partial
block included, at most ``max_blocks``); block *i* is xxh64 of chunk *i* seeded with the hash of
block *i-1*, the chain rooted at ``xxh64(model)`` (GIE chains the same way, by concatenation).
Each endpoint keeps an LRU of the hashes routed to it, sized from its KV capacity; eviction
also removes it from the reverse map.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import xxhash

DEFAULT_CAPACITY = 31_250  # blocks per endpoint when its KV size is unknown (GIE's default)


def prefix_hashes(model: str, text: str, block_chars: int, max_blocks: int) -> list[int]:
    """Chained block hashes of ``text``; empty if it is shorter than one block.

    Block *i* is xxh64 of its characters seeded with block *i-1*'s hash (the chain's root is
    ``xxh64(model)``), so a block's hash depends on everything before it.
    """
    if len(text) < block_chars:
        return []
    data = text[: block_chars * max_blocks].encode()
    previous = xxhash.xxh64_intdigest(model.encode())
    digest = xxhash.xxh64_intdigest
    hashes: list[int] = []
    for start in range(0, len(data), block_chars):
        previous = digest(data[start : start + block_chars], previous)
        hashes.append(previous)
    return hashes


class ApproximatePrefixIndex:
    def __init__(self) -> None:
        self._owners: dict[int, set[str]] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {}

    def __len__(self) -> int:
        return len(self._owners)

    def blocks_of(self, address: str) -> int:
        return len(self._lru.get(address, ()))

    def match(self, hashes: list[int], addresses: Iterable[str]) -> dict[str, int]:
        """Per address, how many leading blocks of ``hashes`` it holds."""
        matched = dict.fromkeys(addresses, 0)
        alive = set(matched)
        depth = 0
        owners_of = self._owners.get
        for block in hashes:
            owners = owners_of(block)
            if not owners:
                break
            if not alive <= owners:
                still = alive & owners
                for address in alive - still:
                    matched[address] = depth
                alive = still
                if not alive:
                    break
            depth += 1
        for address in alive:
            matched[address] = depth
        return matched

    def record(self, address: str, hashes: list[int], capacity: int = DEFAULT_CAPACITY) -> None:
        lru = self._lru.setdefault(address, OrderedDict())
        for block in hashes:
            if block in lru:
                lru.move_to_end(block)
            else:
                lru[block] = None
                self._owners.setdefault(block, set()).add(address)
        while len(lru) > max(capacity, 1):
            evicted, _ = lru.popitem(last=False)
            owners = self._owners.get(evicted)
            if owners is not None:
                owners.discard(address)
                if not owners:
                    del self._owners[evicted]

    def remove(self, address: str) -> None:
        """Forget an endpoint (gone, or restarted with an empty cache)."""
        for block in self._lru.pop(address, ()):
            owners = self._owners.get(block)
            if owners is not None:
                owners.discard(address)
                if not owners:
                    del self._owners[block]
