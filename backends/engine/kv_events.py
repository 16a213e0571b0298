"""KV-cache events as the block manager records them (vLLM's event vocabulary).

The server publishes them on the wire in vLLM's ZMQ + msgpack format (``backends.kv_publisher``).
Hashes are the engine's own 64-bit chained block hashes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Consecutive blocks became full and cached; ``token_ids`` covers all of them in order."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_name: str | None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Cached blocks were evicted and their contents are gone."""

    block_hashes: list[int]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was dropped."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
