"""Subscribe to the engines' KV events (vLLM's ZMQ PUB + msgpack format) and feed the precise
prefix index.

vLLM binds its PUB socket when its endpoint is a wildcard (``tcp://*:5557``, ipc, inproc) and
connects when it names a host. Both layouts are served:

- **connect** (``kv_events: {port}``): one SUB socket per endpoint, connected to the engine's
  host at that port;
- **bind** (``kv_events: {bind: tcp://*:5557}``): one SUB socket bound by the EPP that every
  engine connects to (``--kv-events-config '{"endpoint": "tcp://EPP:5557", "topic": ...}'``);
  each message's topic names its engine: the endpoint's ``kv_events_topic``, or a topic that
  contains the endpoint's address (llm-d's ``kv@<address>@<model>``).

PUB/SUB drops what was sent before a subscriber attached. With ``replay_port`` (vLLM's
``replay_endpoint``, a ROUTER socket), a subscriber asks for the engine's buffered history as
it starts (live batches it then receives twice are skipped), and for what it missed when it
sees a gap; without one, a gap clears that engine's entries.
"""

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
from kvgate.wire.kv_events import EventBatch, KVEventFormatError, decode_batch

log = logging.getLogger("kvgate.epp")
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # vLLM's end-of-replay marker
REPLAY_TIMEOUT = 1.0  # seconds to wait for each replayed message
REPLAY_SETTLE = 0.2  # seconds between subscribing and asking for the history


class KVEventSubscriber:
    """SUB sockets for every endpoint that publishes KV events, feeding a ``PreciseIndex``."""

    def __init__(
        self,
        index: PreciseIndex,
        endpoints: list[Endpoint],
        on_lag: Callable[[float], None] | None = None,
    ) -> None:
        self.index = index
        self.endpoints = [e for e in endpoints if e.kv_events_port or e.kv_events_bind]
        self.on_lag = on_lag
        self.batches = 0
        self.replayed = 0
        self._replayed: dict[tuple[str, int | None], int] = {}  # highest seq a replay applied
        self._context = zmq.asyncio.Context.instance()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        bound: dict[str, list[Endpoint]] = {}
        for endpoint in self.endpoints:
            if endpoint.kv_events_bind:
                bound.setdefault(endpoint.kv_events_bind, []).append(endpoint)
            else:
                self._tasks.append(asyncio.create_task(self._connect(endpoint)))
        for address, endpoints in bound.items():
            socket = self._socket()
            socket.bind(address)  # bound now, so a bad address fails the start
            self._tasks.append(asyncio.create_task(self._bound(socket, endpoints)))

    async def stop(self) -> None:
        await cancel_all(self._tasks)

    def _socket(self) -> zmq.asyncio.Socket:
        socket = self._context.socket(zmq.SUB)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.setsockopt(zmq.LINGER, 0)
        return socket

    async def _connect(self, endpoint: Endpoint) -> None:
        host = endpoint.address.rsplit(":", 1)[0]
        socket = self._socket()
        socket.connect(f"tcp://{host}:{endpoint.kv_events_port}")
        try:
            if endpoint.kv_events_replay_port:  # what the engine sent before we listened
                await asyncio.sleep(REPLAY_SETTLE)  # the subscription reaches the publisher
                await self._replay(endpoint, 0, None, None)
            while True:
                await self.handle(endpoint, await socket.recv_multipart())
        finally:
            socket.close(linger=0)

    async def _bound(self, socket: zmq.asyncio.Socket, endpoints: list[Endpoint]) -> None:
        by_topic = {e.kv_events_topic: e for e in endpoints if e.kv_events_topic}
        unknown: set[bytes] = set()
        try:
            while True:
                frames = await socket.recv_multipart()
                topic = frames[0].decode("utf-8", errors="replace") if frames else ""
                endpoint = by_topic.get(topic) or next(
                    (e for e in endpoints if e.address in topic), None
                )
                if endpoint is None:
                    if frames and frames[0] not in unknown:
                        unknown.add(frames[0])
                        log.warning("KV events on topic %r match no endpoint", topic)
                    continue
                await self.handle(endpoint, frames)
        finally:
            socket.close(linger=0)

    async def handle(self, endpoint: Endpoint, frames: list[bytes]) -> None:
        """One ``[topic, seq, payload]`` message; malformed ones are logged and skipped. With a
        replay port, batches missed before it are fetched and applied first."""
        message = self._decode(endpoint.address, frames)
        if message is None:
            return
        seq, batch = message
        rank = batch.data_parallel_rank
        replayed = self._replayed.get((endpoint.address, rank))
        if replayed is not None:
            if seq <= replayed:
                return  # already applied from the replay
            del self._replayed[(endpoint.address, rank)]
        last = self.index.last_seq(endpoint.address, rank)
        missed_from = 0 if last < 0 else last + 1
        if endpoint.kv_events_replay_port and seq > missed_from:
            await self._replay(endpoint, missed_from, seq, batch.data_parallel_rank)
        self._apply(endpoint.address, seq, batch)

    def _decode(self, address: str, frames: list[bytes]) -> tuple[int, EventBatch] | None:
        if len(frames) != 3 or len(frames[1]) != 8:
            log.warning("malformed KV event message from %s", address)
            return None
        try:
            batch = decode_batch(frames[2])
        except KVEventFormatError as exc:
            log.warning("undecodable KV event batch from %s: %s", address, exc)
            return None
        return int.from_bytes(frames[1], "big"), batch

    def _apply(self, address: str, seq: int, batch: EventBatch) -> None:
        if self.on_lag is not None and batch.ts is not None:
            self.on_lag(max(0.0, time.time() - batch.ts))  # vLLM stamps batches with time.time()
        self.index.apply_batch(address, seq, batch.events, batch.data_parallel_rank)
        self.batches += 1

    async def _replay(
        self, endpoint: Endpoint, start: int, until: int | None, rank: int | None
    ) -> None:
        """Apply the batches ``start`` .. ``until - 1`` (``None``: all buffered, of any rank)
        from the engine's replay socket (vLLM's ROUTER protocol: send the start seq; receive
        ``(topic, seq, payload)`` until seq -1). On a timeout, what arrived is kept and the
        gap clears the engine as usual."""
        host = endpoint.address.rsplit(":", 1)[0]
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(f"tcp://{host}:{endpoint.kv_events_replay_port}")
        try:
            await socket.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                frames = await asyncio.wait_for(socket.recv_multipart(), REPLAY_TIMEOUT)
                if len(frames) < 4 or frames[2] == END_SEQ:
                    return
                message = self._decode(endpoint.address, frames[1:4])
                if message is None:
                    continue
                seq, batch = message
                if until is None:  # everything buffered: live duplicates are skipped later
                    key = (endpoint.address, batch.data_parallel_rank)
                    self._replayed[key] = max(seq, self._replayed.get(key, -1))
                elif not (start <= seq < until and batch.data_parallel_rank == rank):
                    continue
                self._apply(endpoint.address, seq, batch)
                self.replayed += 1
        except TimeoutError:
            log.warning("KV event replay from %s timed out", endpoint.address)
        finally:
            socket.close(linger=0)
