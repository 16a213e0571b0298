"""The KV of whole blocks as it leaves one engine's cache and enters another's.

A prefill worker reads the blocks it holds for a decode worker; the decode worker writes them
into the blocks it allocated for the same tokens. ``KVBlockIO`` is what a model runner offers
for that (the torch runner moves real tensors; the simulated runner keeps no KV and moves only
the size a real cache would).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class BlockData:
    """Some blocks' KV, layer-major: ``shape`` is ``[layers, blocks, block_size, 2, kv_heads,
    head_dim]`` in ``dtype``, ``data`` its raw bytes (read: ``bytes``; to write: any buffer, such
    as a view into a received message). ``num_bytes`` is the KV's size: equal to ``len(data)``,
    except from a runner that keeps no KV (``data`` is then empty)."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes | memoryview
    num_bytes: int

    @property
    def num_blocks(self) -> int:
        return self.shape[1] if len(self.shape) > 1 else 0


class KVBlockIO(Protocol):
    """Reads and writes whole blocks of a runner's KV cache, between steps (never during one)."""

    def bytes_per_block(self) -> int:
        """One block's KV size in the cache's own dtype."""
        ...

    async def read_blocks(self, block_ids: list[int], dtype: str | None) -> BlockData:
        """The KV of ``block_ids``, in ``dtype`` (None: the cache's own)."""
        ...

    async def write_blocks(self, block_ids: list[int], blocks: BlockData) -> None:
        """Write ``blocks`` into ``block_ids`` (as many as it holds); raises ``ValueError``
        if its shape does not fit this cache."""
        ...
