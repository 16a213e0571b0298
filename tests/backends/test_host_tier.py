"""The host tier: evicted blocks' KV offloaded to host memory, restored on a prefix hit, with
vLLM's events (``medium: CPU``) and the transfers the runner applies in order."""

from __future__ import annotations

from backends.engine.block_manager import BlockManager
from backends.engine.host_tier import CPU, HostTier, KVTransfer
from kvgate.wire.kv_events import GPU, BlockRemoved, BlockStored
from tests.fakes import make_seq, run_and_free


def test_an_evicted_prefix_is_offloaded_then_restored_not_recomputed() -> None:
    bm = BlockManager(4, 4, host_blocks=8, record_events=True)
    first = make_seq(13, start=0)
    assert run_and_free(bm, first) == 0
    bm.take_events(), bm.take_transfers()
    assert (
        run_and_free(bm, make_seq(13, start=100)) == 0
    )  # needs every block: the first's are evicted
    offloads = bm.take_transfers()
    assert [t.restore for t in offloads] == [False] * 3 and len(bm.host or []) == 3
    stored_on_host = [e for e in bm.take_events() if isinstance(e, BlockStored)]
    assert {e.medium for e in stored_on_host} == {GPU, CPU}
    cpu = [e for e in stored_on_host if e.medium == CPU]
    assert [h for e in cpu for h in e.block_hashes] == first.block_hashes[2::-1]  # tail first
    assert cpu[1].parent_block_hash == first.block_hashes[0] and cpu[1].token_ids == [4, 5, 6, 7]

    again = make_seq(13, start=0)
    assert run_and_free(bm, again) == 12  # three blocks restored: only the last token is computed
    moves = bm.take_transfers()
    restores = [t for t in moves if t.restore]
    assert [t.host_slot for t in restores] == [t.host_slot for t in reversed(offloads)]
    assert bm.restored_tokens == 12
    back = [e for e in bm.take_events() if isinstance(e, BlockStored) and e.medium == GPU]
    assert back[0].block_hashes == first.block_hashes[:3] and back[0].parent_block_hash is None
    assert back[0].token_ids == list(range(12))


def test_the_tier_is_inclusive() -> None:
    bm = BlockManager(3, 4, host_blocks=4)
    run_and_free(bm, make_seq(9, start=0))  # two full blocks cached
    run_and_free(bm, make_seq(9, start=50))  # evicts them: both offloaded
    assert [t.restore for t in bm.take_transfers()] == [False, False]
    run_and_free(bm, make_seq(9, start=0))  # restored; the other prompt's blocks are offloaded
    assert sorted(t.restore for t in bm.take_transfers()) == [False, False, True, True]
    run_and_free(
        bm, make_seq(9, start=50)
    )  # restored; the first prompt's blocks are evicted again,
    assert [t.restore for t in bm.take_transfers()] == [True, True]  # their copies still held


def test_a_full_tier_drops_its_least_recently_used() -> None:
    bm = BlockManager(3, 4, host_blocks=2, record_events=True)
    first = make_seq(9, start=0)
    run_and_free(bm, first)
    run_and_free(bm, make_seq(9, start=50))
    run_and_free(
        bm, make_seq(9, start=90)
    )  # offloads the second prompt's blocks: the first's dropped
    dropped = [e for e in bm.take_events() if isinstance(e, BlockRemoved) and e.medium == CPU]
    assert sorted(h for e in dropped for h in e.block_hashes) == sorted(first.block_hashes[:2])
    assert run_and_free(bm, make_seq(9, start=0)) == 0  # gone from both tiers: computed again


def test_restores_never_take_the_device_hits() -> None:
    bm = BlockManager(6, 4, host_blocks=8)
    prompt = list(range(17))  # four full blocks and a token
    run_and_free(bm, make_seq(tokens=prompt))
    run_and_free(bm, make_seq(13, start=100))  # evicts the prompt's last two blocks (tail first)
    bm.take_transfers()
    seq = make_seq(tokens=prompt)
    cached, num_cached = bm.get_computed_blocks(seq)
    assert num_cached == 16  # two device hits, two restored; the hits, least recently used,
    held = [bm.blocks[b].block_hash for b in cached]  # were not taken to hold the restores
    assert held == seq.block_hashes[:4]
    assert [t.restore for t in bm.take_transfers()] == [True, False, True]  # the second took
    # the other prompt's least recently used block, offloaded first


def test_restores_leave_a_free_block_for_the_new_tokens() -> None:
    bm = BlockManager(5, 4, host_blocks=8)
    prompt = list(range(13))
    run_and_free(bm, make_seq(tokens=prompt))
    other = make_seq(9, start=100)
    bm.allocate(other, [], 9)  # still running: holds three blocks, one of them the prompt's
    seq = make_seq(tokens=prompt)
    cached, num_cached = bm.get_computed_blocks(seq)
    assert num_cached == 8 and len(cached) == 2  # the third block stays on the host
    assert [t.restore for t in bm.take_transfers()] == [False]


def test_no_tier_without_prefix_caching_and_the_reset_clears_it() -> None:
    assert BlockManager(4, 4, host_blocks=8, enable_prefix_caching=False).host is None
    bm = BlockManager(2, 4, host_blocks=4)
    run_and_free(bm, make_seq(5))
    run_and_free(bm, make_seq(5, start=40))
    assert bm.host is not None and len(bm.host) == 1
    assert bm.reset_prefix_cache() and len(bm.host) == 0


def test_a_host_slot_is_reused_after_its_block_is_dropped() -> None:
    tier = HostTier(1)
    first, dropped = tier.store(1, None, [1, 2], None)
    assert dropped is None and tier.get(1) == first
    second, dropped = tier.store(2, 1, [3, 4], "a")
    assert dropped == 1 and second.slot == first.slot and 1 not in tier
    assert KVTransfer(True, 0, second.slot).restore
