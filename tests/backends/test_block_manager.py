"""Block manager: allocation, sharing, LRU eviction, reference counts, events."""

from __future__ import annotations

import pytest

from backends.engine.block_manager import BlockManager, hash_block
from backends.engine.errors import EngineError
from kvgate.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from tests.fakes import make_seq


def admit(bm: BlockManager, seq, num_new: int | None = None) -> int:  # type: ignore[no-untyped-def]
    cached, num_cached = bm.get_computed_blocks(seq)
    new = seq.num_tokens - num_cached if num_new is None else num_new
    assert bm.can_allocate(seq, cached, new)
    bm.allocate(seq, cached, new)
    return num_cached


@pytest.mark.parametrize(
    ("num_tokens", "block_size", "blocks_used"),
    [(1, 4, 1), (4, 4, 1), (5, 4, 2), (16, 16, 1), (17, 16, 2), (64, 16, 4)],
)
def test_allocation_takes_ceil_blocks(num_tokens: int, block_size: int, blocks_used: int) -> None:
    bm = BlockManager(8, block_size)
    seq = make_seq(num_tokens)
    admit(bm, seq)
    assert len(seq.block_table) == blocks_used
    assert bm.num_free_blocks == 8 - blocks_used


def test_shared_prefix_reuses_blocks_and_leaves_one_token_to_compute() -> None:
    bm = BlockManager(8, 4)
    first, second = make_seq(10), make_seq(10)
    admit(bm, first)
    cached = admit(bm, second)
    # 10 tokens = 2 full blocks + 2; both full blocks come from cache.
    assert cached == 8
    assert second.block_table[:2] == first.block_table[:2]
    assert [bm.blocks[b].ref_count for b in first.block_table[:2]] == [2, 2]
    # A prompt that is exactly two blocks reuses only the first: one token must be computed.
    exact = make_seq(8)
    assert admit(bm, exact) == 4


@pytest.mark.parametrize(
    ("first_lora", "second_lora", "expect_hit"),
    [(None, None, True), ("a", "a", True), ("a", "b", False), (None, "a", False)],
)
def test_lora_name_is_part_of_the_hash(
    first_lora: str | None, second_lora: str | None, expect_hit: bool
) -> None:
    bm = BlockManager(8, 4)
    admit(bm, make_seq(9, lora=first_lora))
    assert (admit(bm, make_seq(9, lora=second_lora)) > 0) is expect_hit


@pytest.mark.parametrize(
    ("first_salt", "second_salt", "expect_hit"),
    [(None, None, True), ("s1", "s1", True), ("s1", "s2", False), (None, "s1", False)],
)
def test_cache_salt_keeps_prefixes_apart(
    first_salt: str | None, second_salt: str | None, expect_hit: bool
) -> None:
    bm = BlockManager(8, 4)
    first, second = make_seq(9), make_seq(9)
    first.cache_salt, second.cache_salt = first_salt, second_salt
    admit(bm, first)
    assert (admit(bm, second) > 0) is expect_hit


def test_only_the_first_block_takes_the_salt() -> None:
    tokens = [1, 2, 3, 4]
    assert hash_block(None, tokens, None, 0, "s") != hash_block(None, tokens, None, 0)
    assert hash_block(7, tokens, None, 0, "s") == hash_block(7, tokens, None, 0)


def test_freed_blocks_stay_cached_until_evicted_tail_first() -> None:
    bm = BlockManager(4, 4)
    seq = make_seq(13)  # 3 full blocks + 1 token -> 4 blocks, 3 cached
    admit(bm, seq)
    hashes = list(seq.block_hashes)
    bm.free(seq)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 3
    # A new unrelated sequence needing 2 blocks: 1 uncached free block, then evicts the LRU
    # cached block, which is the tail of the old prefix (freed first).
    other = make_seq(8, start=100)
    admit(bm, other)
    remaining, _ = bm.get_computed_blocks(make_seq(13))
    assert len(remaining) == 2  # the head of the old prefix survived
    assert hashes[2] not in {bm.blocks[b].block_hash for b in range(4)}


def test_cache_hit_revives_a_free_block_out_of_the_lru() -> None:
    bm = BlockManager(3, 4)
    seq = make_seq(9)
    admit(bm, seq)
    bm.free(seq)
    again = make_seq(9)
    assert admit(bm, again) == 8
    assert all(bm.blocks[b].ref_count == 1 for b in again.block_table)
    assert bm.num_free_blocks == 0


def test_can_allocate_counts_revived_blocks_against_the_free_pool() -> None:
    bm = BlockManager(3, 4)
    seq = make_seq(9)
    admit(bm, seq)
    bm.free(seq)
    # 2 cached free blocks are revived, 1 new block is needed: 3 <= 3 fits; one more token won't.
    big = make_seq(13)
    cached, _ = bm.get_computed_blocks(big)
    assert bm.can_allocate(big, cached, 4)
    assert not bm.can_allocate(big, cached, 5)


def test_append_grows_block_table_only_at_block_boundaries() -> None:
    bm = BlockManager(4, 4)
    seq = make_seq(4)
    admit(bm, seq)
    seq.num_computed_tokens = 4
    seq.token_ids.append(9)
    assert bm.can_append(seq, 1)
    bm.append(seq, 1)
    assert len(seq.block_table) == 2
    seq.num_computed_tokens = 5
    seq.token_ids.append(9)
    bm.append(seq, 1)
    assert len(seq.block_table) == 2


def test_cannot_schedule_unknown_tokens_or_overflow() -> None:
    bm = BlockManager(1, 4)
    seq = make_seq(4)
    with pytest.raises(EngineError):
        bm.allocate(seq, [], 5)
    seq2 = make_seq(8, start=50)
    assert not bm.can_allocate(seq2, [], 8)


def test_double_free_is_an_engine_error() -> None:
    bm = BlockManager(2, 4)
    seq = make_seq(4)
    admit(bm, seq)
    table = list(seq.block_table)
    bm.free(seq)
    seq.block_table = table
    with pytest.raises(EngineError):
        bm.free(seq)


def test_duplicate_full_blocks_are_not_cached_twice() -> None:
    bm = BlockManager(8, 4, enable_prefix_caching=True)
    a, b = make_seq(9), make_seq(9)
    # Both admitted with no cache lookup (as if scheduled in the same step before hashing).
    bm.allocate(a, [], 9)
    bm.allocate(b, [], 9)
    assert bm.num_cached_blocks == 2
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 8 and bm.num_cached_blocks == 2


def test_events_stored_removed_and_cleared() -> None:
    bm = BlockManager(2, 4, record_events=True)
    seq = make_seq(9, lora="ad")
    admit(bm, seq, 8)  # two full blocks
    events = bm.take_events()
    assert events == [BlockStored(seq.block_hashes[:2], None, seq.token_ids[:8], 4, "ad")]
    assert seq.block_hashes[1] == hash_block(seq.block_hashes[0], seq.token_ids[4:8], "ad", 0)
    bm.free(seq)
    other = make_seq(4, start=77)
    admit(bm, other)  # evicts one cached block
    removed = bm.take_events()
    assert isinstance(removed[0], BlockRemoved) and len(removed[0].block_hashes) == 1
    bm.free(other)
    assert bm.reset_prefix_cache()
    assert bm.take_events()[-1] == AllBlocksCleared()
    assert bm.num_cached_blocks == 0


def test_reset_refused_while_blocks_in_use() -> None:
    bm = BlockManager(2, 4)
    admit(bm, make_seq(4))
    assert not bm.reset_prefix_cache()


def test_no_prefix_caching_means_no_hits() -> None:
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    admit(bm, make_seq(9))
    assert admit(bm, make_seq(9)) == 0
    assert bm.num_cached_blocks == 0
