"""Retention: blocks an engine was asked to keep through a pause (an agent's tool running), so
the next call of the session finds its history cached.

A retained block is evicted only when no other free block is left, and only until its pin
expires, its session's next call uses it (the pin is spent: that call's own end pins again if
the session pauses again), or the session's call ends without another pause (released). Pins
are bounded: at most ``max_blocks`` at once, at most ``max_per_owner`` for one owner (a
tenant), each for at most ``max_ttl`` seconds; a pin past a bound is not taken (the leading
blocks of a sequence are pinned first: a prefix hit needs them). A pin never makes an
allocation fail: it only orders eviction.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable

MAX_TTL = 300.0  # seconds a pin may last, whatever is asked


class Retention:
    """Pins by block hash: until when, and whose."""

    def __init__(
        self,
        max_blocks: int,
        max_per_owner: int,
        *,
        max_ttl: float = MAX_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_blocks = max_blocks
        self.max_per_owner = max_per_owner
        self.max_ttl = max_ttl
        self.clock = clock
        self._until: dict[int, float] = {}
        self._owner: dict[int, str] = {}
        self._per_owner: dict[str, int] = {}
        self._expiries: list[tuple[float, int]] = []  # a heap; stale entries are skipped

    def __len__(self) -> int:
        return len(self._until)

    def holds(self, block_hash: int) -> bool:
        until = self._until.get(block_hash)
        return until is not None and until > self.clock()

    def pin(self, hashes: Iterable[int], ttl: float, owner: str) -> list[int]:
        """Pin ``hashes`` for ``ttl`` seconds (capped) for ``owner``, in order, as far as the
        bounds allow; a hash pinned already has its pin extended. The hashes pinned."""
        self.expire()
        until = self.clock() + min(max(ttl, 0.0), self.max_ttl)
        pinned: list[int] = []
        for block_hash in hashes:
            if block_hash in self._until:
                if self._until[block_hash] < until:
                    self._until[block_hash] = until
                    heapq.heappush(self._expiries, (until, block_hash))
                pinned.append(block_hash)
                continue
            if len(self._until) >= self.max_blocks:
                break
            if self._per_owner.get(owner, 0) >= self.max_per_owner:
                break
            self._until[block_hash] = until
            self._owner[block_hash] = owner
            self._per_owner[owner] = self._per_owner.get(owner, 0) + 1
            heapq.heappush(self._expiries, (until, block_hash))
            pinned.append(block_hash)
        return pinned

    def expire(self) -> list[int]:
        """Drop the pins whose time is up; their hashes."""
        now, heap, expired = self.clock(), self._expiries, []
        while heap and heap[0][0] <= now:
            until, block_hash = heapq.heappop(heap)
            if self._until.get(block_hash) != until:
                continue  # extended since, or dropped
            expired.append(block_hash)
            self.drop(block_hash)
        return expired

    def drop(self, block_hash: int) -> None:
        """Forget ``block_hash``'s pin (its block was evicted after all, or expired)."""
        if self._until.pop(block_hash, None) is None:
            return
        owner = self._owner.pop(block_hash)
        left = self._per_owner[owner] - 1
        if left:
            self._per_owner[owner] = left
        else:
            del self._per_owner[owner]

    def clear(self) -> None:
        self._until.clear()
        self._owner.clear()
        self._per_owner.clear()
        self._expiries.clear()
