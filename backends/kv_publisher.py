"""Publish KV-cache events exactly as vLLM does: ZMQ PUB, ``[topic, seq, msgpack batch]``.

``seq`` is an 8-byte big-endian counter starting at 0 for each process (subscribers detect gaps
and restarts from it). The batch is ``[ts, [event, ...], data_parallel_rank]`` and each event a
positional array tagged with its class name:
``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
lora_name]``, ``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``. Hashes are
64-bit integers, as with vLLM's default ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``.
"""

from __future__ import annotations

import time
from typing import Any

import msgpack
import zmq

from backends.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

MEDIUM = "GPU"


def encode_event(event: KVEvent) -> list[Any]:
    if isinstance(event, BlockStored):
        return [
            "BlockStored",
            event.block_hashes,
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            None,  # lora_id: deprecated in vLLM in favour of lora_name
            MEDIUM,
            event.lora_name,
        ]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", event.block_hashes, MEDIUM]
    if isinstance(event, AllBlocksCleared):
        return ["AllBlocksCleared"]
    raise TypeError(f"not a KV event: {event!r}")


def encode_batch(events: list[KVEvent], ts: float) -> bytes:
    payload: bytes = msgpack.packb([ts, [encode_event(e) for e in events], None])
    return payload


class ZmqEventPublisher:
    """A ``KVEventSink`` bound to ``endpoint`` (e.g. ``tcp://127.0.0.1:5557``)."""

    def __init__(self, endpoint: str, topic: str = "", hwm: int = 100_000) -> None:
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._ctx.socket(zmq.PUB)
        self._socket.setsockopt(zmq.SNDHWM, hwm)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(endpoint)
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.seq = 0

    def publish(self, events: list[KVEvent]) -> None:
        payload = encode_batch(events, time.monotonic())
        frames = [self.topic, self.seq.to_bytes(8, "big"), payload]
        # A PUB socket drops (never blocks) at the high-water mark; the seq gap tells readers.
        self._socket.send_multipart(frames, flags=zmq.NOBLOCK)
        self.seq += 1

    def close(self) -> None:
        self._socket.close(linger=0)
