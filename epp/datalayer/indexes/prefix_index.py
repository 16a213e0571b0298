"""The ``PrefixIndex`` contract: which endpoint holds which leading blocks of a request.

The EPP service owns one index per distinct ``PrefixIndexParams`` and hands it to plugins
through their ``PluginHandle``; the prefix-cache scorer reads it, and the service teaches it
each pick as the request is sent (so a burst of one prefix sees it at once) and takes the pick
back if the endpoint refused the connection. Two kinds implement it:
``approximate`` (learned from the picker's own decisions, ``ApproximatePrefixCache``) and
``precise`` (from the engines' KV events, ``PrecisePrefixCache``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from epp.framework import Endpoint, SchedulingRequest

Undo = Callable[[], None] | None  # takes back what one ``learn`` recorded
DEFAULT_CAPACITY = 31_250  # blocks per endpoint when its KV size is unknown (GIE's default)


@dataclass(frozen=True)
class PrefixIndexParams:
    """How requests are cut into blocks and how the index learns (``prefix-cache-scorer``'s
    parameters)."""

    mode: str = "approximate"  # approximate | precise
    block_size_tokens: int = 16
    chars_per_token: int = 4  # approximate: routing text per token, until measured per endpoint
    measure_chars_per_token: bool = True  # approximate: from each endpoint's usage; else fixed
    max_prefix_blocks: int = 256
    lru_capacity_per_endpoint: int = DEFAULT_CAPACITY  # approximate, when KV size is unknown
    tokenizer: str = "byte"  # precise: byte | a model folder (or its tokenizer.json)
    speculative_ttl: float = 2.0  # precise: how long a pick counts before its events arrive
    min_match_blocks: int = 2  # scoring: fewer distinguishing blocks than this score nothing
    # precise: what a block held only in an engine's host memory (medium CPU) or storage tier
    # counts for, against one on its device (what a restore saves of computing the block)
    cpu_tier_weight: float = 0.9
    storage_tier_weight: float = 0.5


class PrefixIndex(Protocol):
    """Which endpoint holds which prefix of a request."""

    params: PrefixIndexParams

    @property
    def routing_limit(self) -> int:
        """Characters of routing text this index reads (0: it reads the body, not the text)."""
        ...

    def keys(self, request: SchedulingRequest) -> list[int]:
        """The request's chained block keys (computed once per request)."""
        ...

    def match(self, keys: list[int], addresses: Iterable[str]) -> Mapping[str, float]:
        """Per address, how many leading blocks of ``keys`` it holds (a block in a lower tier,
        host memory say, counted at less than one: what restoring it saves of computing it)."""
        ...

    def prompt_tokens(self, request: SchedulingRequest) -> int:
        """About how many tokens the whole prompt has."""
        ...

    def uncached_tokens(self, request: SchedulingRequest, endpoint: Endpoint) -> int:
        """About how many prompt tokens ``endpoint`` would have to compute (not cached there),
        in its own tokens where the index knows them."""
        ...

    def holders(self, request: SchedulingRequest, limit: int) -> list[str]:
        """The endpoints believed to hold ``request``'s leading block, those holding the most
        of it first, ``limit`` at most (what a sample of a large pool keeps)."""
        ...

    def uncached_tokens_each(
        self, request: SchedulingRequest, endpoints: list[Endpoint]
    ) -> list[int]:
        """``uncached_tokens`` of each of ``endpoints``, in order, from one match for them all
        (what a scorer of every candidate asks: one lookup per endpoint, not one match)."""
        ...

    def learn(self, request: SchedulingRequest, endpoint: Endpoint) -> Undo:
        """``request`` was sent to ``endpoint``: it will hold the request's blocks. Returns
        what takes that back if the endpoint turns out never to have taken the request."""
        ...

    def learn_keys(self, keys: list[int], endpoint: Endpoint) -> Undo:
        """``learn`` from a request's keys: also how a sibling worker's pick is recorded."""
        ...

    def observe_usage(self, request: SchedulingRequest, endpoint: Endpoint, tokens: int) -> None:
        """``endpoint`` answered ``request`` and reported ``tokens`` prompt tokens (its usage)."""
        ...

    def blocks_of(self, address: str) -> int:
        """How many blocks the index believes ``address`` holds."""
        ...

    def capacity_of(self, endpoint: Endpoint) -> int:
        """How many of this index's blocks ``endpoint``'s KV cache holds (0: not scraped yet)."""
        ...

    def forget(self, address: str) -> None:
        """Drop everything known about ``address`` (gone, or restarted empty)."""
        ...

    async def start(self) -> None:
        """Start whatever feeds the index (the KV-event subscriber); idempotent."""
        ...

    async def stop(self) -> None: ...


def kv_capacity(endpoint: Endpoint, block_size_tokens: int) -> int:
    """``endpoint``'s KV capacity in blocks of ``block_size_tokens`` tokens, from its scraped
    ``num_gpu_blocks`` and block size (0 until scraped)."""
    m = endpoint.metrics
    if m.num_gpu_blocks and m.block_size:
        return max(1, m.num_gpu_blocks * m.block_size // block_size_tokens)
    return 0
