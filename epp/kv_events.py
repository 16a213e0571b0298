"""Subscribe to every endpoint's KV events (vLLM's ZMQ PUB + msgpack format) and feed the
precise prefix index."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import zmq
import zmq.asyncio

from epp.framework import Endpoint
from epp.indexes.precise import PreciseIndex
from epp.tasks import cancel_all
from kvgate.wire.kv_events import KVEventFormatError, decode_batch

log = logging.getLogger("kvgate.epp")


class KVEventSubscriber:
    """One ZMQ SUB socket per endpoint that publishes KV events, feeding a ``PreciseIndex``."""

    def __init__(
        self,
        index: PreciseIndex,
        endpoints: list[Endpoint],
        on_lag: Callable[[float], None] | None = None,
    ) -> None:
        self.index = index
        self.endpoints = [e for e in endpoints if e.kv_events_port]
        self.on_lag = on_lag
        self.batches = 0
        self._context = zmq.asyncio.Context.instance()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for endpoint in self.endpoints:
            self._tasks.append(asyncio.create_task(self._listen(endpoint)))

    async def stop(self) -> None:
        await cancel_all(self._tasks)

    async def _listen(self, endpoint: Endpoint) -> None:
        host = endpoint.address.rsplit(":", 1)[0]
        socket = self._context.socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(f"tcp://{host}:{endpoint.kv_events_port}")
        try:
            while True:
                frames = await socket.recv_multipart()
                self.handle(endpoint.address, frames)
        finally:
            socket.close(linger=0)

    def handle(self, address: str, frames: list[bytes]) -> None:
        """One ``[topic, seq, payload]`` message; malformed ones are logged and skipped."""
        if len(frames) != 3 or len(frames[1]) != 8:
            log.warning("malformed KV event message from %s", address)
            return
        seq = int.from_bytes(frames[1], "big")
        try:
            batch = decode_batch(frames[2])
        except KVEventFormatError as exc:
            log.warning("undecodable KV event batch from %s: %s", address, exc)
            return
        if self.on_lag is not None and batch.ts is not None:
            self.on_lag(max(0.0, time.time() - batch.ts))  # vLLM stamps batches with time.time()
        self.index.apply_batch(address, seq, batch.events)
        self.batches += 1
