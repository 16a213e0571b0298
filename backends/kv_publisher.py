"""Publish KV-cache events as vLLM does: ZMQ PUB, ``[topic, seq, msgpack batch]``, and an
optional replay socket.

``seq`` is an 8-byte big-endian counter starting at 0 for each process (subscribers detect gaps
and restarts from it); the batch is ``kvgate.wire.kv_events``' format, stamped with wall-clock
time as vLLM stamps it. Like vLLM, the PUB socket binds a wildcard, ipc or inproc endpoint
(``tcp://*:5557``) and connects to one that names a host (``tcp://epp:5557``, the subscriber
bound there). With a replay endpoint, a ROUTER socket (served by a thread) answers a request
for a start seq with every buffered batch from there, then the end marker seq -1 (vLLM's
protocol).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import zmq

from kvgate.wire.kv_events import KVEvent, encode_batch

log = logging.getLogger("kvgate.backend")
END_SEQ = (-1).to_bytes(8, "big", signed=True)
REPLAY_BUFFER = 10_000  # batches kept for replay (vLLM's buffer_steps)


def binds(endpoint: str) -> bool:
    """Whether vLLM binds this endpoint (else it connects to it)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    """A ``KVEventSink`` publishing on ``endpoint`` (``tcp://*:5557`` binds; a host connects)."""

    def __init__(
        self,
        endpoint: str,
        topic: str = "",
        hwm: int = 100_000,
        replay_endpoint: str | None = None,
        bind: bool | None = None,
        replay_optional: bool = False,
    ) -> None:
        """``bind``: whether to bind ``endpoint``; ``None`` decides as vLLM does.
        ``replay_optional``: a replay endpoint that cannot be bound (a default port taken) is
        left out with a warning, not an error."""
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._ctx.socket(zmq.PUB)
        self._socket.setsockopt(zmq.SNDHWM, hwm)
        self._socket.setsockopt(zmq.LINGER, 0)
        if binds(endpoint) if bind is None else bind:
            self._socket.bind(endpoint)
        else:
            self._socket.connect(endpoint)
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=REPLAY_BUFFER)
        self._lock = threading.Lock()
        self._replay: threading.Thread | None = None
        self._stopping = threading.Event()
        if replay_endpoint is not None:
            router = self._ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            try:
                router.bind(replay_endpoint)
            except zmq.ZMQError as exc:
                router.close(linger=0)
                if not replay_optional:
                    raise
                log.warning("KV events are not replayed: cannot bind %s (%s)", replay_endpoint, exc)
                return
            self._replay = threading.Thread(
                target=self._serve_replay, args=(router,), name="kv-events-replay", daemon=True
            )
            self._replay.start()

    def publish(self, events: list[KVEvent]) -> None:
        payload = encode_batch(events, time.time())
        seq = self.seq.to_bytes(8, "big")
        # A PUB socket drops (never blocks) at the high-water mark; the seq gap tells readers.
        self._socket.send_multipart([self.topic, seq, payload], flags=zmq.NOBLOCK)
        with self._lock:
            self._buffer.append((self.seq, payload))
        self.seq += 1

    def _serve_replay(self, router: zmq.Socket[bytes]) -> None:
        try:
            while not self._stopping.is_set():
                if not router.poll(100):
                    continue
                frames = router.recv_multipart()
                if len(frames) != 3:
                    continue  # not [client, "", start seq]
                client, _, start = frames
                first = int.from_bytes(start, "big")
                with self._lock:
                    batches = [(s, p) for s, p in self._buffer if s >= first]
                for seq, payload in batches:
                    router.send_multipart(
                        [client, b"", self.topic, seq.to_bytes(8, "big"), payload]
                    )
                router.send_multipart([client, b"", b"", END_SEQ, b""])
        finally:
            router.close(linger=0)

    def close(self) -> None:
        self._stopping.set()
        if self._replay is not None:
            self._replay.join(timeout=1.0)
        self._socket.close(linger=0)
