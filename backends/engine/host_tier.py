"""The host tier: a bounded pool in host memory that keeps the KV of blocks evicted from the
device, so a later prefix hit restores them (a copy) instead of computing them again.

Like vLLM's CPU offloading, the tier is inclusive: a block restored to the device keeps its
host copy, so evicting it again costs no second copy. Slots are reused least recently used
first. The block manager decides what moves; each move is a ``KVTransfer`` the runner applies,
in order, before the step it comes with computes (so a block read out and a block written in
the same step never see each other's data).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

CPU = "CPU"  # the host tier's ``medium`` in vLLM's KV events


@dataclass(frozen=True, slots=True)
class KVTransfer:
    """One block's KV moved between tiers: device block to host slot (an offload), or host
    slot to device block (a restore)."""

    restore: bool
    device_block: int
    host_slot: int


@dataclass(frozen=True, slots=True)
class HostBlock:
    """What the host tier keeps of a block besides its KV: where it is, and what a
    ``BlockStored`` event about it says (its parent's hash, its tokens, its adapter)."""

    slot: int
    parent_hash: int | None
    token_ids: tuple[int, ...]
    lora_name: str | None


class HostTier:
    """Blocks' KV by block hash in ``num_slots`` host slots, least recently used dropped
    first."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError("the host tier needs at least one slot")
        self.num_slots = num_slots
        self._blocks: OrderedDict[int, HostBlock] = OrderedDict()
        self._free = list(range(num_slots - 1, -1, -1))

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def get(self, block_hash: int) -> HostBlock | None:
        """The block (now the most recently used), or None when the tier does not hold it."""
        block = self._blocks.get(block_hash)
        if block is not None:
            self._blocks.move_to_end(block_hash)
        return block

    def store(
        self, block_hash: int, parent_hash: int | None, token_ids: list[int], lora: str | None
    ) -> tuple[HostBlock, int | None]:
        """A slot for a block new to the tier, and the hash of the block dropped to free it
        (None when a slot was free)."""
        dropped: int | None = None
        if self._free:
            slot = self._free.pop()
        else:
            dropped, old = self._blocks.popitem(last=False)
            slot = old.slot
        block = HostBlock(slot, parent_hash, tuple(token_ids), lora)
        self._blocks[block_hash] = block
        return block, dropped

    def clear(self) -> list[int]:
        """Drop every block; their hashes."""
        hashes = list(self._blocks)
        self._blocks.clear()
        self._free = list(range(self.num_slots - 1, -1, -1))
        return hashes
