"""The subscriber's live reading around a gap, over real ZMQ sockets: an engine (played by the
test, speaking vLLM's PUB and replay protocols) skips a batch on the live stream; the
subscriber fetches it from the replay socket, applies the batches in order, and goes on reading
live batches after it."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import zmq
import zmq.asyncio

from epp.datalayer.indexes.precise import PreciseIndex, block_keys
from epp.datalayer.kv_events import END_SEQ, KVEventSubscriber
from epp.framework import Endpoint, EndpointMetadata
from kvgate.wire.kv_events import BlockStored, encode_batch

TOKENS = list(range(64))  # four blocks of 16; batch i stores block i, chained on block i - 1
KEYS = block_keys(TOKENS, 16)


def batch(i: int) -> bytes:
    stored = BlockStored([i + 1], i or None, TOKENS[16 * i : 16 * (i + 1)], 16, None)
    return encode_batch([stored], float(i))


async def serve_replay(router: zmq.asyncio.Socket, asked: list[int], sent: list[int]) -> None:
    """Answer each replay request with the batches sent so far from its start seq on, then
    the end marker."""
    while True:
        client, _, start = await router.recv_multipart()
        first = int.from_bytes(start, "big")
        asked.append(first)
        for seq in [s for s in sent if s >= first]:
            await router.send_multipart([client, b"", b"", seq.to_bytes(8, "big"), batch(seq)])
        await router.send_multipart([client, b"", b"", END_SEQ, b""])


async def depth(index: PreciseIndex, address: str, at_least: int) -> float:
    for _ in range(100):
        held = index.match(KEYS, [address])[address]
        if held >= at_least:
            return held
        await asyncio.sleep(0.02)
    return index.match(KEYS, [address])[address]


async def test_a_missed_batch_is_replayed_before_the_next_and_reading_goes_on() -> None:
    context = zmq.asyncio.Context.instance()
    publisher, router = context.socket(zmq.PUB), context.socket(zmq.ROUTER)
    events_port = publisher.bind_to_random_port("tcp://127.0.0.1")
    replay_port = router.bind_to_random_port("tcp://127.0.0.1")
    asked: list[int] = []
    sent: list[int] = []  # what the engine has published (its replay buffer)
    replies = asyncio.create_task(serve_replay(router, asked, sent))
    endpoint = Endpoint(
        EndpointMetadata(
            "127.0.0.1:1", "p", kv_events_port=events_port, kv_events_replay_port=replay_port
        )
    )
    index = PreciseIndex()
    subscriber = KVEventSubscriber(index, [endpoint])
    await subscriber.start()
    try:
        await asyncio.sleep(0.5)  # subscribed; the start-up replay found nothing yet
        assert asked == [0] and index.last_seq(endpoint.address) == -1
        for seq in (0, 1, 2):
            sent.append(seq)
            if seq != 1:  # seq 1 is lost on the live stream
                await publisher.send_multipart([b"", seq.to_bytes(8, "big"), batch(seq)])
            await asyncio.sleep(0.1)
        assert await depth(index, endpoint.address, 3) == 3  # 1 fetched, then 2 applied
        assert asked == [0, 1] and index.gaps == 0 and subscriber.replayed == 1
        sent.append(3)
        await publisher.send_multipart([b"", (3).to_bytes(8, "big"), batch(3)])
        assert await depth(index, endpoint.address, 4) == 4  # live reading resumed
        assert index.last_seq(endpoint.address, 0) == 3 and subscriber.batches == 4
    finally:
        await subscriber.stop()
        replies.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await replies
        publisher.close(linger=0)
        router.close(linger=0)


@pytest.mark.parametrize(
    ("events", "endpoint", "pool", "expected"),
    [
        (5557, None, None, 5558),  # by default: the events port + 1
        (5557, None, 6000, 6000),
        (5557, 7000, 6000, 7000),
        (5557, 0, 6000, None),  # 0: no replay
        (5557, None, 0, None),
        (None, None, None, None),  # no events port (none, or a socket the picker binds)
    ],
)
def test_where_an_endpoint_replays_its_events(
    events: int | None, endpoint: int | None, pool: int | None, expected: int | None
) -> None:
    from epp.datalayer.datastore import replay_port

    assert replay_port(events, endpoint, pool) == expected
