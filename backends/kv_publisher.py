"""Publish KV-cache events exactly as vLLM does: ZMQ PUB, ``[topic, seq, msgpack batch]``.

``seq`` is an 8-byte big-endian counter starting at 0 for each process (subscribers detect gaps
and restarts from it); the batch is ``kvgate.wire.kv_events``' format, stamped with wall-clock
time as vLLM stamps it.
"""

from __future__ import annotations

import time

import zmq

from kvgate.wire.kv_events import KVEvent, encode_batch


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
        payload = encode_batch(events, time.time())
        frames = [self.topic, self.seq.to_bytes(8, "big"), payload]
        # A PUB socket drops (never blocks) at the high-water mark; the seq gap tells readers.
        self._socket.send_multipart(frames, flags=zmq.NOBLOCK)
        self.seq += 1

    def close(self) -> None:
        self._socket.close(linger=0)
