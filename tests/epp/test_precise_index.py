"""Precise prefix index fed by vLLM-format KV events: stores, removals, clears, gaps, restarts,
speculation, and agreement with a brute-force oracle."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from epp.datalayer.indexes.precise import PreciseIndex, block_keys

A, B = "127.0.0.1:1", "127.0.0.1:2"
BS = 4


def stored(
    hashes: list[int], parent: int | None, tokens: list[int], lora: str | None = None
) -> list[object]:
    return ["BlockStored", hashes, parent, tokens, BS, None, "GPU", lora]


def test_keys_do_not_depend_on_engine_hashes() -> None:
    tokens = list(range(12))
    index = PreciseIndex()
    index.apply_batch(A, 0, [stored([111, 222], None, tokens[:8])])
    index.apply_batch(A, 1, [stored([333], 222, tokens[8:12])])  # continues the chain
    index.apply_batch(B, 0, [stored([9, 8, 7], None, tokens)])  # other engine, other hashes
    keys = block_keys(tokens, BS)
    assert index.match(keys, [A, B]) == {A: 3, B: 3}
    assert index.match(block_keys([*tokens[:4], 99, 99, 99, 99], BS), [A]) == {A: 1}
    assert index.match(block_keys(tokens, BS, lora="sql"), [A]) == {A: 0}


def test_removed_and_all_cleared() -> None:
    tokens = list(range(8))
    index = PreciseIndex()
    index.apply_batch(A, 0, [stored([1, 2], None, tokens)])
    index.apply_batch(A, 1, [["BlockRemoved", [2], "GPU"]])
    assert index.match(block_keys(tokens, BS), [A]) == {A: 1}
    index.apply_batch(A, 2, [["AllBlocksCleared"]])
    assert index.match(block_keys(tokens, BS), [A]) == {A: 0} and len(index) == 0
    index.apply_batch(A, 3, [stored([5], None, tokens[:4])])  # the sequence carries on
    assert index.match(block_keys(tokens, BS), [A]) == {A: 1}


def test_unknown_parent_is_not_indexed() -> None:
    index = PreciseIndex()
    index.apply_batch(A, 0, [stored([7], 12345, list(range(4)))])
    assert len(index) == 0


def test_gap_and_restart_clear_the_endpoint() -> None:
    tokens = list(range(8))
    index = PreciseIndex()
    index.apply_batch(A, 0, [stored([1, 2], None, tokens)])
    index.apply_batch(B, 0, [stored([1, 2], None, tokens)])
    index.apply_batch(A, 5, [])  # seq 1..4 lost
    assert index.gaps == 1 and index.match(block_keys(tokens, BS), [A, B]) == {A: 0, B: 2}
    index.apply_batch(B, 0, [stored([3], None, tokens[:4])])  # B restarted: seq back to 0
    assert index.restarts == 1 and index.match(block_keys(tokens, BS), [B]) == {B: 1}


def test_duplicate_blocks_survive_one_removal() -> None:
    tokens = list(range(4))
    index = PreciseIndex()
    index.apply_batch(A, 0, [stored([1], None, tokens), stored([2], None, tokens)])
    index.apply_batch(A, 1, [["BlockRemoved", [1], "GPU"]])
    assert index.match(block_keys(tokens, BS), [A]) == {A: 1}
    index.apply_batch(A, 2, [["BlockRemoved", [2], "GPU"]])
    assert index.match(block_keys(tokens, BS), [A]) == {A: 0}


def test_speculative_records_expire() -> None:
    index = PreciseIndex(speculative_ttl=0.05)
    keys = block_keys(list(range(8)), BS)
    index.record_speculative(A, keys)
    index.apply_batch(B, 0, [stored([5], None, list(range(4)))])
    assert index.match(keys, [A, B]) == {A: 2, B: 1}
    assert sorted(index.holders_of(keys[0])) == [A, B]  # sent there, or held
    index.forget_speculative(A, keys)  # A never got it
    assert index.holders_of(keys[0]) == [B]
    index.record_speculative(A, keys)
    time.sleep(0.08)
    assert index.match(keys, [A]) == {A: 0} and index.holders_of(keys[0]) == [B]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([A, B]),
            st.sampled_from(["store", "remove", "clear"]),
            st.lists(st.integers(0, 3), min_size=1, max_size=3),
        ),
        max_size=30,
    ),
    st.lists(st.integers(0, 3), min_size=1, max_size=3),
)
def test_agrees_with_a_brute_force_oracle(
    ops: list[tuple[str, str, list[int]]], query: list[int]
) -> None:
    """Prompts are chains of 4-token blocks drawn from a small alphabet of block contents; the
    same query is matched after every batch (the index's memo of the last query must follow)."""
    index = PreciseIndex()
    oracle: dict[str, dict[int, tuple[int, ...]]] = {A: {}, B: {}}  # engine hash -> block chain
    seqs = {A: 0, B: 0}
    keys = block_keys([t for b in query for t in [b] * BS], BS)

    def expected() -> dict[str, int]:
        depths = {}
        for address in (A, B):
            held = set(oracle[address].values())
            depth = 0
            while depth < len(query) and tuple(query[: depth + 1]) in held:
                depth += 1
            depths[address] = depth
        return depths

    for address, op, blocks in ops:
        chain = tuple(blocks)
        engine_hashes = [hash((address, chain[: i + 1])) & 0xFFFFFFFF for i in range(len(chain))]
        if op == "store":
            tokens = [t for b in chain for t in [b] * BS]
            event = stored(engine_hashes, None, tokens)
            for i, h in enumerate(engine_hashes):
                oracle[address][h] = chain[: i + 1]
        elif op == "remove":
            event = ["BlockRemoved", engine_hashes[-1:], "GPU"]
            oracle[address].pop(engine_hashes[-1], None)
        else:
            event = ["AllBlocksCleared"]
            oracle[address].clear()
        index.apply_batch(address, seqs[address], [event])
        seqs[address] += 1
        assert index.match(keys, [A]) == {A: expected()[A]}
        assert index.match(keys, [A, B]) == expected()


def test_a_match_follows_speculation_taken_back() -> None:
    index = PreciseIndex()
    keys = block_keys(list(range(8)), BS)
    index.record_speculative(A, keys[:1])
    assert index.match(keys, [A]) == {A: 1}
    index.record_speculative(A, keys)
    assert index.match(keys, [A, B]) == {A: 2, B: 0}
    index.forget_speculative(A, keys)
    assert index.match(keys, [A, B]) == {A: 0, B: 0}


def tagged(hashes: list[int], parent: int | None, tokens: list[int], **fields: object) -> object:
    """A BlockStored event as vLLM 0.32 sends it (defaults left out)."""
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": BS,
        "medium": "GPU",
        **fields,
    }


def test_other_tiers_are_not_gpu_resident() -> None:
    tokens = list(range(8))
    index = PreciseIndex()
    index.apply_batch(A, 0, [tagged([1, 2], None, tokens, medium="CPU")])
    assert index.match(block_keys(tokens, BS), [A]) == {A: 0}
    index.apply_batch(A, 1, [tagged([1, 2], None, tokens)])
    index.apply_batch(A, 2, [{"type": "BlockRemoved", "block_hashes": [2], "medium": "CPU"}])
    assert index.match(block_keys(tokens, BS), [A]) == {A: 2}  # the CPU copy went, not this


def test_lower_tiers_are_credited_at_their_weights_after_the_device() -> None:
    tokens = list(range(20))  # five blocks
    keys = block_keys(tokens, BS)
    index = PreciseIndex(tier_weights={"CPU": 0.75, "STORAGE": 0.25, "DISK": 0.0})
    index.apply_batch(A, 0, [tagged([1, 2, 3, 4, 5], None, tokens)])
    # the tail went to host memory as it left the device (its parent still on the device)
    cpu = [tagged([4], 3, tokens[12:16], medium="CPU"), tagged([5], 4, tokens[16:], medium="CPU")]
    index.apply_batch(A, 1, [*cpu, {"type": "BlockRemoved", "block_hashes": [4, 5]}])
    assert index.match(keys, [A]) == {A: 3 + 2 * 0.75}
    index.apply_batch(A, 2, [tagged([5], 4, tokens[16:], medium="STORAGE")])
    index.apply_batch(A, 3, [{"type": "BlockRemoved", "block_hashes": [5], "medium": "CPU"}])
    assert index.match(keys, [A]) == {A: 3 + 0.75 + 0.25}  # each block at its best tier
    index.apply_batch(A, 4, [{"type": "BlockRemoved", "block_hashes": [4], "medium": "CPU"}])
    assert index.match(keys, [A]) == {A: 3}  # leading blocks only: the fifth is cut off
    index.apply_batch(A, 5, [tagged([6], None, [9, 9, 9, 9], medium="DISK")])  # no weight
    assert index.match(block_keys([9, 9, 9, 9], BS), [A]) == {A: 0}
    index.apply_batch(A, 6, [["AllBlocksCleared"]])
    assert index.match(keys, [A]) == {A: 0}


def test_a_tier_held_prefix_ranks_between_the_device_and_nothing() -> None:
    tokens = list(range(16))
    keys = block_keys(tokens, BS)
    index = PreciseIndex(tier_weights={"CPU": 0.9})
    index.apply_batch(A, 0, [tagged([1, 2, 3, 4], None, tokens)])
    index.apply_batch(B, 0, [tagged([1, 2, 3, 4], None, tokens, medium="CPU")])
    assert index.match(keys, [A, B, "127.0.0.1:3"]) == {A: 4, B: 3.6, "127.0.0.1:3": 0}
    assert len(index) == 4 and index.blocks_of(B) == 0  # the device's blocks, as before


def test_extra_keys_and_groups_take_part_in_block_identity() -> None:
    tokens = list(range(8))
    index = PreciseIndex()
    extras = [["sql", "salt-1"], ["sql"]]
    index.apply_batch(A, 0, [tagged([1, 2], None, tokens, lora_name="sql", extra_keys=extras)])
    salted = block_keys(tokens, BS, lora="sql", cache_salt="salt-1")
    assert index.match(salted, [A]) == {A: 2}
    assert index.match(block_keys(tokens, BS, lora="sql"), [A]) == {A: 0}  # no salt
    assert index.match(block_keys(tokens, BS, cache_salt="salt-1"), [A]) == {A: 0}  # no LoRA
    # the same engine hashes in another KV-cache group are other blocks
    index.apply_batch(B, 0, [tagged([1, 2], None, tokens, group_idx=1)])
    assert index.match(block_keys(tokens, BS), [B]) == {B: 0}
    index.apply_batch(B, 1, [tagged([1, 2], None, tokens)])
    index.apply_batch(B, 2, [{"type": "BlockRemoved", "block_hashes": [1, 2], "group_idx": 1}])
    assert index.match(block_keys(tokens, BS), [B]) == {B: 2}


def test_sequence_numbers_count_per_data_parallel_rank() -> None:
    tokens = list(range(8))
    index = PreciseIndex()
    index.apply_batch(A, 0, [tagged([1, 2], None, tokens)], rank=0)
    index.apply_batch(A, 0, [], rank=1)  # another engine behind the same server
    index.apply_batch(A, 1, [], rank=0)
    assert index.gaps == index.restarts == 0
    assert index.match(block_keys(tokens, BS), [A]) == {A: 2}
