"""The backend's KV-event wire encoding: current vLLM's (0.32) batch of msgspec tagged maps."""

from __future__ import annotations

import msgpack

from kvgate.wire.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    encode_batch,
)


def test_batch_is_tagged_maps_as_current_vllm_sends() -> None:
    events: list[KVEvent] = [
        BlockStored([11, 12], None, list(range(8)), 4, "ad"),
        BlockRemoved([11]),
        AllBlocksCleared(),
    ]
    decoded = msgpack.unpackb(encode_batch(events, 12.5))
    assert decoded == [
        12.5,
        [
            {
                "type": "BlockStored",
                "block_hashes": [11, 12],
                "parent_block_hash": None,
                "token_ids": list(range(8)),
                "block_size": 4,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": "ad",
                "group_idx": 0,
            },
            {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU", "group_idx": 0},
            {"type": "AllBlocksCleared"},
        ],
        0,  # the rank, always: a strict three-element decoder (Dynamo's) needs it
    ]
    assert msgpack.unpackb(encode_batch([], 1.0, data_parallel_rank=2)) == [1.0, [], 2]


def test_a_batch_decodes_as_a_strict_three_element_array() -> None:
    ts, events, rank = msgpack.unpackb(encode_batch([BlockRemoved([1])], 3.0))
    assert (ts, len(events), rank) == (3.0, 1, 0)
