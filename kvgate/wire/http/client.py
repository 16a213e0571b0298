"""One HTTP/1.1 connection to an upstream: an asyncio protocol over httptools' response parser,
and the response it reads (``kvgate.wire.http.connection_pool`` keeps them per endpoint).

``ConnectionPool.request`` sends one request on an idle kept-alive connection to the endpoint
(or a new one) and returns once the response headers are in; the body is then read whole
(``read``), chunk by chunk (``readany``), or pushed to a callback as each chunk arrives
(``push``: a relay's way, with no task woken per chunk). ``close`` returns a fully read, keep-alive
connection to the pool and closes any other (an unfinished response is aborted, which tells the
upstream to stop generating). A reused connection that the upstream had closed before answering
is retried once on a fresh connection. Reading pauses when 256 KiB are buffered unread. A
response head over ``MAX_UPSTREAM_HEAD`` bytes fails the request (UpstreamConnectionError).
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable
from typing import Protocol, cast

import httptools
from mypy_extensions import mypyc_attr

from kvgate.wire.http.messages import header_size

_HIGH_WATER = 256 * 1024
MAX_UPSTREAM_HEAD = 64 * 1024  # bytes of status line + headers an upstream may send
# bytes of an upstream body held whole (to read its usage, restore its model name) before the
# holder gives up on it; streams relayed as they come have no such bound
MAX_UPSTREAM_BODY = 256 << 20


# mypyc cannot compile a subclass of a builtin exception into a native class: a plain one.
@mypyc_attr(native_class=False)
class UpstreamConnectionError(ConnectionError):
    """Connecting failed, or the upstream closed the connection before the response ended."""


@mypyc_attr(native_class=False)
class UpstreamBodyTooLarge(UpstreamConnectionError):
    """A body read whole ran past the reader's limit (the connection is not reusable)."""


class UpstreamResponse:
    """One response; ``status``, ``raw_headers`` (name/value byte pairs as sent),
    ``content_type`` and ``length`` are known on return."""

    __slots__ = ("_conn", "_declared", "content_type", "raw_headers", "status")

    def __init__(
        self,
        conn: UpstreamConnection,
        status: int,
        raw_headers: list[tuple[bytes, bytes]],
        content_type: str,
        declared: bytes | None = None,
    ) -> None:
        self.status = status
        self.raw_headers = raw_headers
        self.content_type = content_type
        self._conn = conn
        self._declared = declared  # Content-Length as sent, for a body with no transfer coding

    @property
    def length(self) -> int | None:
        """The body's size as its ``Content-Length`` gives it; None when it has none (or a
        transfer coding)."""
        declared = self._declared
        return int(declared) if declared is not None and declared.strip().isdigit() else None

    def read_now(self) -> bytes | None:
        """The whole body if it has all arrived (the usual case: it came with the headers),
        else None (then ``await read()``)."""
        conn = self._conn
        return conn.take_all() if conn.complete else None

    async def read(self, idle: float | None = None, limit: int | None = None) -> bytes:
        """The whole body; TimeoutError if ``idle`` seconds pass with no bytes arriving,
        ``UpstreamBodyTooLarge`` as soon as more than ``limit`` bytes have come."""
        whole = self.read_now()
        if whole is None:
            parts, size = [], 0
            while chunk := await self._conn.next_chunk(idle):
                size += len(chunk)
                if limit is not None and size > limit:
                    break
                parts.append(chunk)
            else:
                whole = parts[0] if len(parts) == 1 else b"".join(parts)
        if whole is None or (limit is not None and len(whole) > limit):
            raise UpstreamBodyTooLarge(f"the upstream's response body is over {limit} bytes")
        return whole

    async def readany(self, idle: float | None = None) -> bytes:
        """The next buffered body bytes; ``b""`` once the body is complete. TimeoutError if
        ``idle`` seconds pass with nothing new."""
        return await self._conn.next_chunk(idle)

    async def push(self, sink: Callable[[bytes], bool], idle: float | None = None) -> bool:
        """Hand the body to ``sink`` chunk by chunk, each as it arrives, from the connection's
        own callback: no task wakes per chunk. True once the body is complete; False as soon
        as ``sink`` returns False (it wants its task back: read on with ``push`` or
        ``readany``). TimeoutError if ``idle`` seconds pass with nothing new; an exception
        ``sink`` raises is raised here."""
        return await self._conn.push(sink, idle)

    def interrupt(self) -> None:
        """Make a ``push`` waiting for the next chunk return False now (the connection and
        what arrives stay as they are: read on with ``push``)."""
        self._conn.interrupt()

    def buffered(self) -> bytes:
        """The body bytes that arrived and were not read yet (taken: read on after them)."""
        return self._conn.take_all()

    def discard_rest(self, within: float) -> None:
        """The rest of the body is not wanted: it is dropped as it arrives, and the connection
        is kept once the body ends (``close`` then waits for that), or closed if the end does
        not come within ``within`` seconds. Nobody waits for it."""
        self._conn.discard_rest(within)

    def close(self) -> None:
        self._conn.release()


class Pool(Protocol):
    """What a connection tells the pool that owns it (``connection_pool.ConnectionPool``)."""

    def watch(self, conn: UpstreamConnection, deadline: float) -> None:
        """Fail ``conn``'s response head unless it is in by ``deadline`` (loop time)."""

    def unwatch(self, conn: UpstreamConnection) -> None:
        """``conn``'s head is in, or it is gone: no deadline."""

    def put_back(self, conn: UpstreamConnection) -> None:
        """``conn`` is idle and kept alive: reuse it."""

    def forget(self, conn: UpstreamConnection) -> None:
        """``conn`` is closed: never reuse it."""


class UpstreamConnection(asyncio.Protocol):
    """One kept-alive HTTP/1.1 connection to an upstream, owned by its ``ConnectionPool``
    (a harness may make one over its own transport and ``put_back`` it as idle)."""

    def __init__(self, pool: Pool, key: str) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.idle_since = 0.0
        self._headers: list[tuple[bytes, bytes]] = []
        self._framing: list[tuple[bytes, bytes]] = []  # the headers that frame the body
        self._loop = asyncio.get_running_loop()
        self._head: asyncio.Future[UpstreamResponse] | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self.complete = False
        self._received = False
        self._in_head = False  # reading a response's status line and headers
        self._interim = False  # the message being read is a 1xx interim response (skipped)
        self._head_size = 0
        self._until_close = False  # the body ends when the connection does (no length given)
        self._keep_alive = False
        self._waiter: asyncio.Future[None] | None = None
        self._idle = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_data = 0.0
        self._paused = False
        self._sink: Callable[[bytes], bool] | None = None  # takes body chunks as they arrive
        self._arrived: list[bytes] = []  # body pieces parsed from the bytes being received
        self._sink_error: Exception | None = None
        self._discarding: asyncio.TimerHandle | None = None  # the rest dropped until then
        self._release_pending = False  # released while discarding: the body's end releases it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool.forget(self)
        self.pool.unwatch(self)
        if self._until_close and self._head is not None and self._head.done():
            self.complete = True
        error = UpstreamConnectionError("the upstream closed the connection")
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        self._wake()

    def data_received(self, data: bytes) -> None:
        self._received = True
        self._last_data = self._loop.time()
        if self._in_head:
            self._head_size += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._take_arrived()  # what came before the malformed bytes is passed on
            self._fail("malformed upstream response")
            return
        except httptools.HttpParserUpgrade:  # a 101: on_headers_complete failed it already
            return
        finally:
            if self._arrived:
                self._take_arrived()
        # httptools buffers an unfinished head whole: bound it (a chunk that completed the head
        # may carry body bytes too: then on_headers_complete counts the headers themselves)
        if self._in_head and self._head_size > MAX_UPSTREAM_HEAD:
            self._fail(f"upstream response headers exceed {MAX_UPSTREAM_HEAD} bytes")

    def _fail(self, message: str) -> None:
        if self._head is not None and not self._head.done():
            self._head.set_exception(UpstreamConnectionError(message))
        self.abort()

    # --- parser callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.complete or self._head is None:
            # a message nobody asked for (after the response owed, or before any request):
            # read on, it would take the next request's answer for its own; the parser stops
            # here and data_received retires the connection (a whole response's body stays)
            raise UpstreamConnectionError("the upstream sent a response nobody asked for")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))  # decoded only if passed on (most are not)
        size = len(name)
        if size == 12 or size == 14 or size == 17:  # content-type, -length, transfer-encoding
            self._framing.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self._head_size > MAX_UPSTREAM_HEAD and header_size(self._headers) > MAX_UPSTREAM_HEAD:
            return  # still "in the head": data_received fails the request
        status = self.parser.get_status_code()
        if status == 101:  # the gateway never asks for another protocol: not a response
            self._fail("the upstream switched protocols unasked (101)")
            return
        if 100 <= status < 200:
            # an interim response (100 Continue, 103 Early Hints): the final one follows
            self._interim = True
            self._headers = []
            self._framing = []
            return
        self._in_head = False
        content_type, declared, coded, chunked = "", None, False, False
        for name, value in self._framing:
            if name == b"content-type":
                content_type = value.partition(b";")[0].strip().lower().decode("latin-1")
            elif name == b"content-length":
                declared = value
            elif name == b"transfer-encoding":
                coded, chunked = True, value.lower().find(b"chunked") >= 0  # not ``in``: sse.py
        self._until_close = declared is None and not chunked and status not in (204, 304)
        self._keep_alive = self.parser.should_keep_alive()  # reset once the message ends
        self.pool.unwatch(self)
        response = UpstreamResponse(
            self, status, self._headers, content_type, None if coded else declared
        )
        if self._head is not None and not self._head.done():
            self._head.set_result(response)

    def on_body(self, body: bytes) -> None:
        # the pieces of one read (a chunked body's chunks) are taken together once it is parsed:
        # a relay that got several events at once writes them on in one write
        self._arrived.append(body)

    def _take_arrived(self) -> None:
        arrived = self._arrived
        body = arrived[0] if len(arrived) == 1 else b"".join(arrived)
        arrived.clear()
        if not body:
            return
        sink = self._sink
        if sink is not None:
            try:
                if sink(body):
                    return
            except Exception as exc:  # raised in the pushing task, not in the parser
                self._sink_error = exc
            self._sink = None
            self._wake()
            return
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        if self._waiter is not None:
            self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self.complete = True
        if self._waiter is not None:
            self._wake()
        if self._release_pending:  # once the parser is done with this message
            self._release_pending = False
            self._loop.call_soon(self.release)

    # --- use -------------------------------------------------------------------------------
    def start(self, request: bytes, timeout: float | None) -> asyncio.Future[UpstreamResponse]:
        """Send ``request``; the future gets the response head, or TimeoutError about
        ``timeout`` seconds later (the pool sweeps deadlines: no timer per request)."""
        self._headers = []
        self._framing = []
        if self._paused:  # a connection reused after a paused read must be read again
            self._resume()
        self._chunks.clear()
        self._buffered = 0
        self.complete = False
        self._received = False
        self._in_head = True
        self._interim = False
        self._head_size = 0
        self._until_close = False
        loop = self._loop
        self._last_data = now = loop.time()
        self._head = head = loop.create_future()
        assert self.transport is not None
        self.transport.write(request)
        if timeout is not None:
            self.pool.watch(self, now + timeout)
        return head

    def expire_head(self) -> None:
        """The first-byte deadline passed (called by the pool's timer)."""
        if self._head is not None and not self._head.done():
            self._head.set_exception(TimeoutError())

    async def next_chunk(self, idle: float | None) -> bytes:
        while True:
            if self._chunks:
                chunk = self._pop()
                if self._paused and self._buffered < _HIGH_WATER // 4:
                    self._resume()
                return chunk
            if self.complete:
                return b""
            if self.lost:
                raise UpstreamConnectionError("the upstream closed the connection mid-response")
            await self._wait(idle)

    async def push(self, sink: Callable[[bytes], bool], idle: float | None) -> bool:
        """``UpstreamResponse.push``."""
        while self._chunks:  # what arrived before
            if not sink(self._pop()):
                return False
        self._resume()
        while not self.complete:
            if self.lost:
                raise UpstreamConnectionError("the upstream closed the connection mid-response")
            self._sink = sink
            try:
                await self._wait(idle)
            finally:
                stopped, self._sink = self._sink is None, None
            if self._sink_error is not None:
                error, self._sink_error = self._sink_error, None
                raise error
            if stopped:
                return False
        return True

    def interrupt(self) -> None:
        """``UpstreamResponse.interrupt``."""
        if self._sink is not None and self._discarding is None:
            self._sink = None
            self._wake()

    def _pop(self) -> bytes:
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        return chunk

    async def _wait(self, idle: float | None) -> None:
        """Until body bytes arrive (or the body ends, or the connection is lost); TimeoutError
        if ``idle`` seconds pass with nothing new."""
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        if idle is not None:
            self._idle = idle
            if self._idle_timer is None:  # one timer per response, re-armed when it fires
                self._idle_timer = loop.call_later(idle, self._check_idle)
        try:
            await waiter
        finally:
            self._waiter = None

    def _check_idle(self) -> None:
        """The idle timer fired: fail the waiting reader if nothing arrived for ``idle``
        seconds, else wait for the rest of the interval."""
        self._idle_timer = None
        if self._waiter is None or self._waiter.done():
            return
        loop = asyncio.get_running_loop()
        quiet = loop.time() - self._last_data
        if quiet >= self._idle:
            self._waiter.set_exception(TimeoutError())
        else:
            self._idle_timer = loop.call_later(self._idle - quiet, self._check_idle)

    def _stop_discarding(self) -> None:
        if self._discarding is not None:
            self._discarding.cancel()
            self._discarding = None
            self._sink = None

    def _stop_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def take_all(self) -> bytes:
        """Every buffered body byte (the body is complete)."""
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused:
            self._resume()
        return data

    def _resume(self) -> None:
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def discard_rest(self, within: float) -> None:
        """``UpstreamResponse.discard_rest``."""
        self.take_all()
        if self.complete or self.lost:
            return
        self._sink = _discard
        self._discarding = self._loop.call_later(within, self.abort)

    def release(self) -> None:
        if self._idle_timer is not None:
            self._stop_idle_timer()
        if self._discarding is not None and not self.complete and not self.lost:
            self._release_pending = True
            return
        if self.complete and not self.lost and not self._chunks and self._keep_alive:
            self._stop_discarding()
            self.pool.put_back(self)
        else:
            self.abort()

    def abort(self) -> None:
        self._stop_discarding()
        self._release_pending = False
        self._stop_idle_timer()
        self.pool.unwatch(self)
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    @property
    def answered(self) -> bool:
        return self._received

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def _discard(chunk: bytes) -> bool:
    """A sink that drops what it is given and asks for more."""
    return True
