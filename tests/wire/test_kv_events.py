"""vLLM's KV-event wire format, read back as the EPP reads it."""

from __future__ import annotations

import msgpack
import pytest

from kvgate.wire.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventFormatError,
    decode_batch,
    decode_event,
    encode_batch,
)


def test_what_the_publisher_encodes_decodes_to_the_same_events() -> None:
    events = [
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
        {"type": "BlockStored"},  # a tagged map: read by issue 13's decoder, skipped here
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
