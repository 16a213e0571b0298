"""vLLM's KV-event wire encoding."""

from __future__ import annotations

import msgpack

from kvgate.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, encode_batch


def test_batch_is_positional_arrays_tagged_by_class_name() -> None:
    events = [
        BlockStored([11, 12], None, list(range(8)), 4, "ad"),
        BlockRemoved([11]),
        AllBlocksCleared(),
    ]
    decoded = msgpack.unpackb(encode_batch(events, 12.5))
    assert decoded == [
        12.5,
        [
            ["BlockStored", [11, 12], None, list(range(8)), 4, None, "GPU", "ad"],
            ["BlockRemoved", [11], "GPU"],
            ["AllBlocksCleared"],
        ],
        None,
    ]
