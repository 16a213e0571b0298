"""The EPP's subscriber fed the same engine history in both of vLLM's event formats: current
tagged maps and older positional arrays leave the same index."""

from __future__ import annotations

import msgpack

from epp.datalayer.indexes.precise import PreciseIndex, block_keys
from epp.datalayer.kv_events import KVEventSubscriber
from epp.framework import Endpoint, EndpointMetadata

A = "127.0.0.1:1"
TOKENS = list(range(48))


def frames(seq: int, payload: object) -> list[bytes]:
    return [b"kv@127.0.0.1:1@m", seq.to_bytes(8, "big"), msgpack.packb(payload)]


CURRENT = [
    [
        1.0,
        [
            {
                "type": "BlockStored",
                "block_hashes": [1, 2, 3],
                "parent_block_hash": None,
                "token_ids": TOKENS,
                "block_size": 16,
                "medium": "GPU",
                "group_idx": 0,
            }
        ],
    ],
    [2.0, [{"type": "BlockRemoved", "block_hashes": [3], "medium": "GPU"}]],
    [
        3.0,
        [
            {
                "type": "BlockStored",
                "block_hashes": [9],
                "parent_block_hash": None,
                "token_ids": TOKENS[:16],
                "block_size": 16,
                "medium": "CPU",
            }
        ],
    ],
]
OLDER = [
    [1.0, [["BlockStored", [1, 2, 3], None, TOKENS, 16, None, "GPU"]], None],
    [2.0, [["BlockRemoved", [3], "GPU"]], None],
    [3.0, [["BlockStored", [9], None, TOKENS[:16], 16, None, "CPU"]], None],
]


async def feed(history: list[list[object]]) -> PreciseIndex:
    index = PreciseIndex()
    subscriber = KVEventSubscriber(index, [Endpoint(EndpointMetadata(A, "p", kv_events_port=1))])
    for seq, batch in enumerate(history):
        await subscriber.handle(subscriber.endpoints[0], frames(seq, batch))
    assert subscriber.batches == len(history)
    return index


async def test_both_formats_build_the_same_index() -> None:
    current, older = await feed(CURRENT), await feed(OLDER)
    keys = block_keys(TOKENS, 16)
    assert current.match(keys, [A]) == older.match(keys, [A]) == {A: 2}
    assert current.blocks_of(A) == older.blocks_of(A) == 2


async def test_malformed_messages_are_skipped() -> None:
    index = PreciseIndex()
    subscriber = KVEventSubscriber(index, [Endpoint(EndpointMetadata(A, "p", kv_events_port=1))])
    await subscriber.handle(subscriber.endpoints[0], [b"topic", b"short", b""])
    await subscriber.handle(subscriber.endpoints[0], [b"t", (0).to_bytes(8, "big"), b"\xc1"])
    assert subscriber.batches == 0 and index.last_seq(A) == -1
