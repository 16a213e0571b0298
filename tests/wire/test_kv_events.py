"""vLLM's KV-event wire format, read back as the EPP reads it."""

from __future__ import annotations

import msgpack
import pytest

from kvgate.wire.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventFormatError,
    decode_batch,
    decode_event,
    encode_batch,
)


def test_what_the_publisher_encodes_decodes_to_the_same_events() -> None:
    events: list[KVEvent] = [
        BlockStored([1, 2], None, list(range(8)), 4, "ad"),
        BlockRemoved([1]),
        AllBlocksCleared(),
    ]
    batch = decode_batch(encode_batch(list(events), 1700000000.25))
    assert batch.ts == 1700000000.25
    assert [decode_event(raw) for raw in batch.events] == events


@pytest.mark.parametrize(
    "raw",
    [
        [],
        "BlockStored",
        ["BlockStored", "not-a-list", None, [1], 4],
        ["BlockStored", [1], "parent-as-text", [1, 2, 3, 4], 4],
        ["BlockRemoved"],
        ["SomethingNew", 1],
        {"type": "BlockStored"},  # a tagged map without its fields
        {
            "type": "BlockStored",
            "block_hashes": [1],
            "parent_block_hash": None,
            "token_ids": [1],
            "block_size": 0,
        },
        {"block_hashes": [1]},  # no tag
    ],
)
def test_unknown_or_malformed_events_are_skipped(raw: object) -> None:
    assert decode_event(raw) is None


def test_an_undecodable_batch_is_a_format_error() -> None:
    with pytest.raises(KVEventFormatError):
        decode_batch(b"\xc1")
    with pytest.raises(KVEventFormatError):
        decode_batch(msgpack.packb(7))
    assert decode_batch(msgpack.packb(["late", "x"])).ts is None


# What vLLM 0.32 sends (vllm/distributed/kv_events.py: KVCacheEvent is a msgspec Struct with
# tag=True and omit_defaults=True; EventBatch is array_like), as msgpack would carry it.
VLLM_032_BATCH = [
    1764590000.5,
    [
        {
            "type": "BlockStored",
            "block_hashes": [2**64 - 1, 7],
            "parent_block_hash": None,
            "token_ids": list(range(256)),
            "block_size": 128,
            "lora_id": 1,
            "medium": "GPU",
            "lora_name": "sql",
            "extra_keys": [["sql", "salt-1"], ["sql"]],
            "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
            "session_id": "s",
        },
        {
            "type": "BlockRemoved",
            "block_hashes": [b"\x00" * 24 + b"\x00\x00\x00\x00\x00\x00\x00\x07"],
            "medium": "CPU",
        },
        {"type": "AllBlocksCleared"},
    ],
    3,
]
# The same events as an older vLLM sent them: positional arrays tagged with the class name.
OLDER_BATCH = [
    1764590000.5,
    [
        ["BlockStored", [2**64 - 1, 7], None, list(range(256)), 128, 1, "GPU", "sql"],
        ["BlockRemoved", [7], "CPU"],
        ["AllBlocksCleared"],
    ],
]


def test_current_tagged_maps_and_older_positional_arrays_both_decode() -> None:
    current = decode_batch(msgpack.packb(VLLM_032_BATCH))
    older = decode_batch(msgpack.packb(OLDER_BATCH))
    assert (current.ts, current.data_parallel_rank) == (1764590000.5, 3)
    assert older.data_parallel_rank is None
    new = [decode_event(raw) for raw in current.events]
    old = [decode_event(raw) for raw in older.events]
    stored = new[0]
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == [2**64 - 1, 7] and stored.block_size == 128
    assert stored.lora_name == "sql" and stored.medium == "GPU"
    assert stored.extra_keys == [("sql", "salt-1"), ("sql",)]
    assert old[0] == BlockStored([2**64 - 1, 7], None, list(range(256)), 128, "sql")
    assert new[1] == old[1] == BlockRemoved([7], "CPU")  # a hash sent as bytes reads as its int
    assert new[2] == old[2] == AllBlocksCleared()
