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

PUB/SUB drops what was sent before a subscriber attached. With a replay port (vLLM's
``replay_endpoint``, a ROUTER socket; by default the events port + 1, where the kvgate backend
serves it), a subscriber asks for the engine's buffered history as it starts, and the start
waits for it, so a restarted picker knows what warm engines hold before its first pick (live
batches it then receives twice are skipped); and for what it missed when it sees a gap. Without
one (``replay_port: 0``), a gap clears that engine's entries.

The SUB sockets are read from the event loop's reader callback, every queued message at once
and applied in place; only a replay runs as a task, the socket paused until it is done.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass

import zmq
import zmq.asyncio

from epp.datalayer.indexes.precise import PreciseIndex
from epp.datalayer.tasks import cancel_all
from epp.framework import Endpoint
from kvgate.wire.kv_events import EventBatch, KVEventFormatError, decode_batch

log = logging.getLogger("kvgate.epp")
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # vLLM's end-of-replay marker
REPLAY_TIMEOUT = 1.0  # seconds to wait for each replayed message
REPLAY_SETTLE = 0.2  # seconds between subscribing and asking for the history
START_WAIT = REPLAY_SETTLE + REPLAY_TIMEOUT + 1.0  # the longest a start waits for the histories
Route = Callable[[list[bytes]], Endpoint | None]  # which endpoint a message is from


@dataclass(frozen=True, slots=True)
class _Gap:
    """A live batch held back until the batches ``start`` .. ``seq - 1`` are replayed."""

    endpoint: Endpoint
    start: int
    seq: int
    batch: EventBatch


class _Listener:
    """A SUB socket, read by the event loop's reader callback while ``reading``."""

    def __init__(self, socket: zmq.Socket[bytes], route: Route) -> None:
        self.socket = socket
        self.route = route
        fd = socket.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        self.fd = fd
        self.reading = False


class KVEventSubscriber:
    """SUB sockets for every endpoint that publishes KV events, feeding a ``PreciseIndex``."""

    def __init__(
        self,
        index: PreciseIndex,
        endpoints: list[Endpoint],
    ) -> None:
        """``index``'s hooks hear of lag and of messages it cannot use."""
        self.index = index
        self.endpoints = [e for e in endpoints if e.spec.kv_events_port or e.spec.kv_events_bind]
        self.batches = 0
        self.replayed = 0
        self._replayed: dict[tuple[str, int | None], int] = {}  # highest seq a replay applied
        self._warned: set[tuple[str, str]] = set()
        self._context = zmq.asyncio.Context.instance()
        self._listeners: list[_Listener] = []
        self._tasks: set[asyncio.Task[None]] = set()  # replays under way

    async def start(self) -> None:
        """Subscribe to every endpoint's events; an endpoint with a replay port is first asked
        for what it holds, and the start waits for those replays (``START_WAIT`` at most), so
        that a picker started next to warm engines is informed from its first pick."""
        bound: dict[str, list[Endpoint]] = {}
        histories = []
        for endpoint in self.endpoints:
            if endpoint.spec.kv_events_bind:
                bound.setdefault(endpoint.spec.kv_events_bind, []).append(endpoint)
                continue
            host = endpoint.address.rsplit(":", 1)[0]
            socket = self._socket()
            socket.connect(f"tcp://{host}:{endpoint.spec.kv_events_port}")
            listener = self._listen(socket, _only(endpoint))
            if endpoint.spec.kv_events_replay_port:  # what the engine sent before we listened
                histories.append(self._spawn(self._history(endpoint, listener)))
            else:
                self._resume(listener)
        for address, endpoints in bound.items():
            socket = self._socket()
            socket.bind(address)  # bound now, so a bad address fails the start
            self._resume(self._listen(socket, _by_topic(endpoints)))
        if histories:
            await asyncio.wait(histories, timeout=START_WAIT)

    async def stop(self) -> None:
        listeners, self._listeners = self._listeners, []  # first: replays then resume nothing
        for listener in listeners:
            self._pause(listener)
            listener.socket.close(linger=0)
        await cancel_all(list(self._tasks))

    def _socket(self) -> zmq.Socket[bytes]:
        socket: zmq.Socket[bytes] = zmq.Socket(self._context, zmq.SUB)  # read without futures
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.setsockopt(zmq.LINGER, 0)
        return socket

    def _listen(self, socket: zmq.Socket[bytes], route: Route) -> _Listener:
        listener = _Listener(socket, route)
        self._listeners.append(listener)  # closed by ``stop``, read or not
        return listener

    def _spawn(self, work: Coroutine[object, object, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _resume(self, listener: _Listener) -> None:
        if not listener.reading:
            listener.reading = True
            asyncio.get_running_loop().add_reader(listener.fd, self._drain, listener)
        self._drain(listener)  # ZMQ's descriptor signals edges: what is queued is read now

    def _pause(self, listener: _Listener) -> None:
        if listener.reading:
            listener.reading = False
            asyncio.get_running_loop().remove_reader(listener.fd)

    def _drain(self, listener: _Listener) -> None:
        socket = listener.socket
        while listener.reading and has_message(socket):
            frames = socket.recv_multipart(zmq.NOBLOCK)
            endpoint = listener.route(frames)
            if endpoint is None:
                continue
            gap = self._take(endpoint, frames)
            if gap is not None:  # the socket waits while the missed batches are fetched
                self._pause(listener)
                self._spawn(self._fill(gap, listener))

    async def _history(self, endpoint: Endpoint, listener: _Listener) -> None:
        try:
            await asyncio.sleep(REPLAY_SETTLE)  # the subscription reaches the publisher
            await self._replay(endpoint, 0, None, None)
        finally:
            if listener in self._listeners:  # not stopped meanwhile
                self._resume(listener)

    async def _fill(self, gap: _Gap, listener: _Listener | None = None) -> None:
        try:
            await self._replay(gap.endpoint, gap.start, gap.seq, gap.batch.data_parallel_rank)
            self._apply(gap.endpoint.address, gap.seq, gap.batch)
        finally:
            if listener is not None and listener in self._listeners:
                self._resume(listener)

    async def handle(self, endpoint: Endpoint, frames: list[bytes]) -> None:
        """One ``[topic, seq, payload]`` message; malformed ones are logged and skipped. With a
        replay port, batches missed before it are fetched and applied first."""
        gap = self._take(endpoint, frames)
        if gap is not None:
            await self._fill(gap)

    def _take(self, endpoint: Endpoint, frames: list[bytes]) -> _Gap | None:
        """Apply one message now, or return the gap to replay before it can be."""
        message = self._decode(endpoint.address, frames)
        if message is None:
            return None
        seq, batch = message
        rank = batch.data_parallel_rank
        replayed = self._replayed.get((endpoint.address, rank))
        if replayed is not None:
            if seq <= replayed:
                return None  # already applied from the replay
            del self._replayed[(endpoint.address, rank)]
        last = self.index.last_seq(endpoint.address, rank)
        missed_from = 0 if last < 0 else last + 1
        if endpoint.spec.kv_events_replay_port and seq > missed_from:
            return _Gap(endpoint, missed_from, seq, batch)
        self._apply(endpoint.address, seq, batch)
        return None

    def _decode(self, address: str, frames: list[bytes]) -> tuple[int, EventBatch] | None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self._unusable(address, "malformed", f"{len(frames)} frames")
            return None
        try:
            batch = decode_batch(frames[2])
        except KVEventFormatError as exc:
            self._unusable(address, "undecodable", str(exc))
            return None
        return int.from_bytes(frames[1], "big"), batch

    def _unusable(self, address: str, reason: str, detail: str) -> None:
        """Counted each time; logged the first time per endpoint and reason (an engine whose
        event format changed sends nothing else)."""
        if (address, reason) not in self._warned:
            self._warned.add((address, reason))
            log.warning(
                "%s KV event message from %s (%s); further ones are counted in "
                "kvgate_epp_kv_events_unusable_total",
                reason,
                address,
                detail,
            )
        if self.index.hooks.unusable is not None:
            self.index.hooks.unusable(address, reason)

    def _apply(self, address: str, seq: int, batch: EventBatch) -> None:
        lag = self.index.hooks.lag
        if lag is not None and batch.ts is not None:
            lag(max(0.0, time.time() - batch.ts))  # vLLM stamps batches with time.time()
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
        socket.connect(f"tcp://{host}:{endpoint.spec.kv_events_replay_port}")
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
            log.warning(
                "KV event replay from %s timed out: does it serve one on port %d (vLLM's "
                "replay_endpoint; the kvgate backend's is its events port + 1)? "
                "kv_events.replay_port: 0 turns replay off",
                endpoint.address,
                endpoint.spec.kv_events_replay_port,
            )
        finally:
            socket.close(linger=0)


_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: no enum arithmetic per call


def has_message(socket: zmq.Socket[bytes]) -> bool:
    """Whether a message is queued on ``socket`` (what ZMQ's edge-signalling descriptor asks
    a reader to check after each wake-up and each receive)."""
    events = socket.getsockopt(_EVENTS)
    return isinstance(events, int) and bool(events & _POLLIN)


def _only(endpoint: Endpoint) -> Route:
    """Every message on a socket of its own is from ``endpoint``."""
    return lambda _frames: endpoint


def _by_topic(endpoints: list[Endpoint]) -> Route:
    """Which of ``endpoints`` a message on a shared socket is from: the one whose
    ``kv_events_topic`` it carries, else one whose address its topic contains."""
    topics = {e.spec.kv_events_topic: e for e in endpoints if e.spec.kv_events_topic}
    unknown: set[bytes] = set()

    def route(frames: list[bytes]) -> Endpoint | None:
        topic = frames[0].decode("utf-8", errors="replace") if frames else ""
        endpoint = topics.get(topic) or next((e for e in endpoints if e.address in topic), None)
        if endpoint is None and frames and frames[0] not in unknown:
            unknown.add(frames[0])
            log.warning("KV events on topic %r match no endpoint", topic)
        return endpoint

    return route
