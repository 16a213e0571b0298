"""Paged KV-cache block manager with prefix caching.

A block holds ``block_size`` tokens' KV. Full blocks are identified by a chained hash,
``hash(parent_hash, block_token_ids, extra_keys)`` where the extra key is the LoRA name, so two
requests that share a prefix (and adapter) share the blocks. Blocks are reference counted; a
block whose count drops to zero keeps its cached contents and joins an LRU of free cached blocks,
evicted only when a new block is needed and no never-used (uncached) free block is left. A
sequence's blocks are freed tail first, so the tail of a prefix is evicted before its head.

With a host tier (``host_blocks``), an evicted block's KV is offloaded to host memory first and
a prefix hit there restores it (``backends.engine.host_tier``); the moves are handed to the
runner with the next step (``take_transfers``).

Blocks retained for a session in a pause (``retain``, ``backends.engine.retention``) wait in
their own LRU while free, taken only when no other free block is left.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from backends.engine.errors import EngineError
from backends.engine.host_tier import CPU, HostTier, KVTransfer
from backends.engine.retention import Retention
from backends.engine.sequence import Sequence
from kvgate.wire.block_hash import ROOT, extra_key, token_bytes
from kvgate.wire.block_hash import hash_block as chained_hash
from kvgate.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


def hash_block(
    parent: int | None,
    token_ids: list[int],
    extra: str | None,
    seed: int,
    cache_salt: str | None = None,
) -> int:
    """Chained hash of one full block (``kvgate.wire.block_hash``); ``parent`` is None for the
    first block, whose chain starts at the ``seed`` and takes the request's ``cache_salt`` (as
    vLLM salts only the first block: the chain carries it to the rest)."""
    root = ROOT ^ seed if parent is None else parent
    salt = b"\x00salt:" + cache_salt.encode() if cache_salt and parent is None else b""
    return chained_hash(root, token_bytes(token_ids) + extra_key(extra) + salt)


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    # what an offload to the host tier publishes (kept only with a host tier)
    parent_hash: int | None = None
    token_ids: list[int] | None = None
    lora_name: str | None = None


class BlockManager:
    """Allocates KV blocks to sequences; each check (``can_*``) pairs with its action."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        *,
        enable_prefix_caching: bool = True,
        hash_seed: int = 0,
        record_events: bool = False,
        host_blocks: int = 0,
        max_retained: int = 0,
        max_retained_per_owner: int = 0,
    ) -> None:
        """``host_blocks``: the host tier's size (0: none); ``max_retained``: how many blocks
        may be retained at once (0: no retention), ``max_retained_per_owner`` for one owner
        (default: all of them)."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_seed = hash_seed
        self.record_events = record_events
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._cached: dict[int, int] = {}
        self._free_uncached: list[int] = list(range(num_blocks - 1, -1, -1))
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._num_hashed_blocks: dict[int, int] = {}
        self._events: list[KVEvent] = []
        self.host = HostTier(host_blocks) if host_blocks and enable_prefix_caching else None
        self._transfers: list[KVTransfer] = []
        self.restored_tokens = 0  # prompt tokens the host tier served, restored not computed
        self.offloaded_blocks = 0  # blocks copied to the host tier
        self.retention: Retention | None = None
        if max_retained > 0 and enable_prefix_caching:
            self.retention = Retention(max_retained, max_retained_per_owner or max_retained)
        self._free_retained: OrderedDict[int, None] = OrderedDict()
        self.retained_hit_tokens = 0  # prompt tokens found in blocks retained at the time

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_uncached) + len(self._free_cached) + len(self._free_retained)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by running sequences (free cached blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, seq: Sequence) -> tuple[list[int], int]:
        """The cached blocks that hold a prefix of ``seq``, and how many tokens they cover.

        At least one token is always left to compute, so the runner has a position to sample
        from; a fully cached prompt therefore reuses all but its last block.
        """
        if (
            not self.enable_prefix_caching
            or seq.num_computed_tokens > 0
            or seq.sampling.prompt_logprobs is not None  # every position's logits are needed
        ):
            return [], 0
        max_blocks = (seq.num_tokens - 1) // self.block_size
        self._ensure_hashes(seq, max_blocks)
        hits: list[int] = []
        for block_hash in seq.block_hashes[:max_blocks]:
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
            if block_id in self._free_retained:
                self.retained_hit_tokens += self.block_size
        if self.host is not None and len(hits) < max_blocks:
            hits += self._restore(seq, hits, max_blocks)
        return hits, len(hits) * self.block_size

    def can_allocate(self, seq: Sequence, cached_blocks: list[int], num_new_tokens: int) -> bool:
        num_tokens = len(cached_blocks) * self.block_size + num_new_tokens
        num_new_blocks = self.blocks_needed(num_tokens) - len(cached_blocks)
        num_revived = sum(1 for b in cached_blocks if self.blocks[b].ref_count == 0)
        return num_new_blocks + num_revived <= self.num_free_blocks

    def allocate(self, seq: Sequence, cached_blocks: list[int], num_new_tokens: int) -> None:
        """Give a waiting ``seq`` its cached prefix blocks plus room for ``num_new_tokens``."""
        if seq.block_table:
            raise EngineError(f"{seq.request_id} already holds blocks")
        for block_id in cached_blocks:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                if block_id in self._free_cached:
                    del self._free_cached[block_id]
                else:  # the session it was kept for is back: its pin is spent
                    del self._free_retained[block_id]
                    self._spend_pin(block)
            block.ref_count += 1
        seq.block_table = list(cached_blocks)
        seq.num_computed_tokens = len(cached_blocks) * self.block_size
        self._num_hashed_blocks[seq.seq_id] = len(cached_blocks)
        self.append(seq, num_new_tokens)

    def reserve(self, seq: Sequence, num_new_tokens: int) -> None:
        """Blocks for ``num_new_tokens`` more tokens whose KV is written from elsewhere (a KV
        connector's load); they join the prefix cache only when ``append`` is called for the
        same tokens, once their KV is there."""
        num_tokens = seq.num_computed_tokens + num_new_tokens
        if num_tokens > len(seq.token_ids):
            raise EngineError(f"{seq.request_id}: cannot reserve tokens that are not known yet")
        needed = -(-num_tokens // self.block_size) - len(seq.block_table)
        if needed > self.num_free_blocks:
            raise EngineError(f"{seq.request_id}: out of KV blocks (check can_allocate first)")
        for _ in range(needed):
            seq.block_table.append(self._take_free_block())

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        needed = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        needed -= len(seq.block_table)
        return needed <= 0 or needed <= len(self._free_uncached) + len(self._free_cached)

    def append(self, seq: Sequence, num_new_tokens: int, lookahead: int = 0) -> None:
        """Make room for ``num_new_tokens`` more tokens of ``seq`` and cache blocks they fill;
        and for ``lookahead`` draft tokens after them (speculative decoding), whose blocks are
        cached only once their tokens are the sequence's."""
        num_tokens = seq.num_computed_tokens + num_new_tokens
        if num_tokens > len(seq.token_ids):
            raise EngineError(f"{seq.request_id}: cannot schedule tokens that are not known yet")
        table = seq.block_table
        needed = -(-(num_tokens + lookahead) // self.block_size) - len(table)
        if needed > 0:
            if needed > self.num_free_blocks:
                raise EngineError(f"{seq.request_id}: out of KV blocks (check can_append first)")
            for _ in range(needed):
                table.append(self._take_free_block())
        num_full = num_tokens // self.block_size
        if self.enable_prefix_caching and num_full > self._num_hashed_blocks.get(seq.seq_id, 0):
            self._cache_full_blocks(seq, num_full)

    def free(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks, tail first; cached blocks stay reusable until evicted."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise EngineError(f"block {block_id} freed more often than allocated")
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.block_hash is None:
                    self._free_uncached.append(block_id)
                elif self.retention is not None and self.retention.holds(block.block_hash):
                    self._free_retained[block_id] = None
                else:
                    self._free_cached[block_id] = None
        seq.block_table = []
        self._num_hashed_blocks.pop(seq.seq_id, None)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block; refused (False) while any block is in use."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block_id in [*self._free_cached, *self._free_retained]:
            self.blocks[block_id].block_hash = None
            self._free_uncached.append(block_id)
        self._free_cached.clear()
        self._free_retained.clear()
        self._cached.clear()
        if self.retention is not None:
            self.retention.clear()
        if self.host is not None:
            self.host.clear()
        if self.record_events:
            self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events

    def take_transfers(self) -> list[KVTransfer]:
        """The tier moves since the last call, in the order the runner must apply them."""
        transfers, self._transfers = self._transfers, []
        return transfers

    def _restore(self, seq: Sequence, hits: list[int], max_blocks: int) -> list[int]:
        """Device blocks for the host tier's run of ``seq``'s blocks after its device ``hits``,
        their KV copied back before the next step; as many as leave a free block for the new
        tokens. They join the prefix cache as free cached blocks, the most recently used."""
        host = self.host
        assert host is not None
        wanted = []
        for block_hash in seq.block_hashes[len(hits) : max_blocks]:
            if block_hash not in host or block_hash in self._cached:
                break
            wanted.append(block_hash)
        for block_id in hits:  # the hits are not taken to hold the restored blocks
            for free in (self._free_cached, self._free_retained):
                if block_id in free:
                    free.move_to_end(block_id)
        spare = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        restored: list[int] = []
        for block_hash in wanted[: max(0, self.num_free_blocks - spare - 1)]:
            kept = host.get(block_hash)
            if kept is None:  # dropped from the host tier to take an offload meanwhile
                break
            block = self.blocks[self._take_free_block()]
            block.ref_count, block.block_hash = 0, block_hash
            block.parent_hash, block.token_ids = kept.parent_hash, list(kept.token_ids)
            block.lora_name = kept.lora_name
            self._cached[block_hash] = block.block_id
            self._free_cached[block.block_id] = None
            self._transfers.append(KVTransfer(True, block.block_id, kept.slot))
            restored.append(block.block_id)
        if restored:
            self.restored_tokens += len(restored) * self.block_size
            self._record_stored(seq, len(hits), wanted[: len(restored)])
        return restored

    def _offload(self, block: Block) -> None:
        """Keep an evicted block's KV in the host tier (a copy, unless it holds it already)."""
        host, block_hash = self.host, block.block_hash
        if host is None or block_hash is None or host.get(block_hash) is not None:
            return
        tokens = block.token_ids or []
        kept, dropped = host.store(block_hash, block.parent_hash, tokens, block.lora_name)
        self._transfers.append(KVTransfer(False, block.block_id, kept.slot))
        self.offloaded_blocks += 1
        if self.record_events:
            if dropped is not None:
                self._events.append(BlockRemoved([dropped], CPU))
            parent, lora, size = block.parent_hash, block.lora_name, self.block_size
            self._events.append(BlockStored([block_hash], parent, tokens, size, lora, CPU))

    def retain(self, hashes: list[int], ttl: float, owner: str) -> int:
        """Keep the cached blocks of ``hashes`` (a sequence's, leading first) through a pause
        of up to ``ttl`` seconds, as the bounds allow; how many are pinned."""
        if self.retention is None:
            return 0
        pinned = self.retention.pin(hashes, ttl, owner)
        for block_hash in pinned:
            block_id = self._cached.get(block_hash)
            if block_id is not None and block_id in self._free_cached:
                del self._free_cached[block_id]
                self._free_retained[block_id] = None
        return len(pinned)

    def _take_free_block(self) -> int:
        if self._free_uncached:
            block_id = self._free_uncached.pop()
        else:
            if self._free_retained:
                self.release_expired()
            free = self._free_cached or self._free_retained  # retained only as a last resort
            block_id, _ = free.popitem(last=False)
            self._evict(self.blocks[block_id])
        self.blocks[block_id].ref_count = 1
        return block_id

    def release(self, hashes: list[int]) -> None:
        """Pins on ``hashes`` end now (their session is over); their free blocks become the
        most recently used of the free cached."""
        for block_hash in hashes:
            block_id = self._cached.get(block_hash)
            if block_id is not None:
                self._spend_pin(self.blocks[block_id])

    def _spend_pin(self, block: Block) -> None:
        if self.retention is None or block.block_hash is None:
            return
        self.retention.drop(block.block_hash)
        if block.block_id in self._free_retained:
            del self._free_retained[block.block_id]
            self._free_cached[block.block_id] = None

    def release_expired(self) -> None:
        """Blocks whose pins expired become the least recently used of the free cached."""
        if self.retention is None:
            return
        for block_hash in self.retention.expire():
            block_id = self._cached.get(block_hash)
            if block_id is not None and block_id in self._free_retained:
                del self._free_retained[block_id]
                self._free_cached[block_id] = None
                self._free_cached.move_to_end(block_id, last=False)

    def _evict(self, block: Block) -> None:
        if block.block_hash is None:
            return
        if self.retention is not None:
            self.retention.drop(block.block_hash)
        if self._cached.get(block.block_hash) == block.block_id:
            del self._cached[block.block_hash]
            self._offload(block)
            if self.record_events:
                self._events.append(BlockRemoved([block.block_hash]))
        block.block_hash = None

    def _ensure_hashes(self, seq: Sequence, num_full_blocks: int) -> None:
        hashes = seq.block_hashes
        while len(hashes) < num_full_blocks:
            index = len(hashes)
            parent = hashes[-1] if hashes else None
            tokens = seq.block_tokens(index, self.block_size)
            hashes.append(hash_block(parent, tokens, seq.lora_name, self.hash_seed, seq.cache_salt))

    def _cache_full_blocks(self, seq: Sequence, num_full_blocks: int) -> None:
        start = self._num_hashed_blocks.get(seq.seq_id, 0)
        if num_full_blocks <= start:
            return
        self._ensure_hashes(seq, num_full_blocks)
        stored: list[int] = []
        first_stored = -1
        for index in range(start, num_full_blocks):
            block = self.blocks[seq.block_table[index]]
            block_hash = seq.block_hashes[index]
            if block.block_hash is None and block_hash not in self._cached:
                block.block_hash = block_hash
                self._cached[block_hash] = block.block_id
                if self.host is not None:
                    self._keep_origin(seq, block, index)
                if first_stored < 0:
                    first_stored = index
                stored.append(block_hash)
            elif stored:
                self._record_stored(seq, first_stored, stored)
                stored, first_stored = [], -1
        if stored:
            self._record_stored(seq, first_stored, stored)
        self._num_hashed_blocks[seq.seq_id] = num_full_blocks

    def _keep_origin(self, seq: Sequence, block: Block, index: int) -> None:
        """What an offload of ``block`` (``seq``'s ``index``-th) will publish."""
        block.parent_hash = seq.block_hashes[index - 1] if index > 0 else None
        block.token_ids = seq.block_tokens(index, self.block_size)
        block.lora_name = seq.lora_name

    def _record_stored(self, seq: Sequence, first_index: int, hashes: list[int]) -> None:
        if not self.record_events:
            return
        size = self.block_size
        parent = seq.block_hashes[first_index - 1] if first_index > 0 else None
        tokens = seq.token_ids[first_index * size : (first_index + len(hashes)) * size]
        self._events.append(BlockStored(hashes, parent, tokens, size, seq.lora_name))
