"""kvgate's HTTP/1.1 server: an asyncio protocol over httptools' parser (llhttp), no framework.

Why not aiohttp's server: on this path every microsecond is per request, and aiohttp's request
and response machinery alone costs about as much CPU as the whole proxy may spend
(``docs/benchmarks.md``). This server does what the gateway needs and nothing else:

- keep-alive, pipelined requests answered in order (reading pauses while one is in flight);
- a head limit (``MAX_HEAD``: request line and headers; 431) and a body limit: a request that
  declares or sends more than ``max_body`` bytes gets a 413 and the connection closes once it
  is written;
- ``Expect: 100-continue`` answered by the server itself; an ``Upgrade`` it does not perform
  (h2c from Java's client or ``curl --http2``, a WebSocket) is ignored, as HTTP/1.1 allows:
  the request is served as a plain one; ``CONNECT`` gets a 405;
- a request target in absolute form (``POST http://host/v1/...``) served by its path;
- malformed requests answered 400 and the connection closed, and so are HTTP/1.1 requests
  without a Host header or with several (RFC 9112); a transfer coding other than ``chunked``
  gets a 501;
- a client that goes away cancels its handler task (so the upstream call is cancelled too);
- TCP_NODELAY on every connection; idle keep-alive connections closed after ``keepalive``;
- a request head that takes longer than ``header_timeout`` gets a 408 (slow-header clients),
  and so does a body still unfinished ``body_timeout`` after its head (slow-body clients);
- ``head_check`` (optional) sees the head of a request whose body is large (over
  ``EARLY_CHECK_BYTES``, or chunked) before any of it is read, and may refuse it (e.g. 401):
  nobody unauthenticated makes the server buffer a large body;
- ``shutdown(grace)``: stop accepting, close idle connections, let handlers finish; those
  still running after ``grace`` are cancelled with ``SHUTDOWN_CUT`` (a stream can end with an
  error event) and get ``CUT_WAIT`` more before their connections close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, cast

import httptools
from aiohttp import web
from multidict import CIMultiDict

from kvgate.wire.http.messages import AnyResponse, Request, Response, header_size
from kvgate.wire.http.request_head import (
    framing_refusal,
    head_without_upgrade,
    method_of,
    origin_form,
)
from kvgate.wire.openai_errors import body_too_large

log = logging.getLogger("kvgate.http")

Handler = Callable[[Request], Awaitable[AnyResponse]]
MAX_HEAD = 64 * 1024  # bytes of request line + headers (aiohttp allows 8 KiB per line)
ErrorFactory = Callable[[int, str], Response]
# (request target, headers) -> a response that refuses the request, or None to read its body
HeadCheck = Callable[[bytes, CIMultiDict[str]], Response | None]
EARLY_CHECK_BYTES = 64 * 1024  # bodies larger than this are checked from the head first
# the cancellation message of a request still in flight when the shutdown grace is over
SHUTDOWN_CUT = "kvgate: the server is shutting down"
CUT_WAIT = 1.0  # seconds cut handlers get to write their last word


class Connection(asyncio.Protocol):
    """One client connection: parse, hand complete requests to the handler one at a time."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self.peer = ""  # the client's address, once connected
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []  # as sent (forwarded as bytes)
        self._mapping: CIMultiDict[str] = CIMultiDict()  # the headers of the current request
        self._body: list[bytes] = []
        self._size = 0
        self._too_large = False
        self._in_head = True  # reading a request line and headers
        self._upgrade_ignored = False  # the head asked for an upgrade: it is parsed again without
        self._head_size = 0
        self._pending: deque[Request] = deque()
        self._worker: asyncio.Task[None] | None = None  # serves this connection's requests
        self._wakeup: asyncio.Future[None] | None = None  # the idle worker waits on it
        self._busy = False  # a request is being handled
        self._closing = False
        self._refused = False  # a refusal was answered (or waits for the answers before it)
        self._eof = False  # the write side is shut: nothing more may be written
        self._final: Response | None = None  # a refusal to send once earlier answers are out
        self._lost = False
        self._drain: asyncio.Future[None] | None = None
        self._paused = False
        self.last_active = server.loop.time()  # idle keep-alive connections are swept
        self.head_started = 0.0  # when the head being read began (slow heads are swept too)
        self.body_started = 0.0  # when the body being read began (0: none is being read)

    # --- asyncio protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._closing = self._lost = True
        if self._worker is not None:
            self._worker.cancel()
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("the client went away"))
        self._pending.clear()
        self._body = []  # a half-read body is not kept after the client went away
        self._headers = []
        self._url = b""

    def data_received(self, data: bytes) -> None:
        self.last_active = self._server.loop.time()
        if self._closing:
            return
        if self._in_head:
            if not self._head_size:
                self.head_started = self.last_active  # a request's head begins
            self._head_size += len(data)
        if not self._feed(data):
            return
        # httptools buffers a request line and headers whole: bound what is still unfinished
        # (a chunk that completed the head may carry body bytes too: it does not count; a head
        # refused while parsing has had its answer)
        if self._in_head and self._head_size > MAX_HEAD and not self._closing:
            self._reject(431, f"request line and headers exceed {MAX_HEAD} bytes")

    def _feed(self, data: bytes) -> bool:
        """Parse ``data``; False when the connection is being refused."""
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            if self._parser.get_method() == b"CONNECT":
                self._reject(405, "CONNECT is not supported")
                return False
            # the parser stopped after the head (not reading a body): parse it again without
            # the upgrade, then what followed it
            head = head_without_upgrade(self._parser, self._url, self._headers)
            self._parser = httptools.HttpRequestParser(self)
            self._upgrade_ignored = False
            self._url = b""
            self._headers = []
            return self._feed(head + data[upgrade.args[0] :])
        except httptools.HttpParserError:
            if not self._closing:  # a head already refused (its framing) is answered once
                self._reject(400, "malformed HTTP request")
            return False
        return True

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    # --- parser callbacks (per-message state is reset when a message completes) ------------
    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self._head_size > MAX_HEAD and header_size(self._headers) > MAX_HEAD:
            # a whole head that came in one read (data_received only bounds unfinished ones)
            self._reject(431, f"request line and headers exceed {MAX_HEAD} bytes")
            return
        if self._parser.should_upgrade():  # llhttp ends the message here: see _feed
            self._upgrade_ignored = True
            return
        self._in_head = False
        self.body_started = self.last_active  # set by data_received for this chunk
        self._mapping = headers = CIMultiDict(
            [(name.decode("latin-1"), value.decode("latin-1")) for name, value in self._headers]
        )
        if not self._url.startswith(b"/"):
            self._url = origin_form(self._url)
        malformed = framing_refusal(headers, self._parser)
        if malformed is not None:
            self._too_large = True  # what body comes is dropped unread
            self._body = []
            self._reject(*malformed)
            return
        declared = headers.get("content-length")
        check = self._server.head_check
        if check is not None and (
            (declared is None and "transfer-encoding" in headers)
            or (declared is not None and declared.isdigit() and int(declared) > EARLY_CHECK_BYTES)
        ):
            refusal = check(self._url, headers)
            if refusal is not None:  # refused from its head: the body is never buffered
                self._too_large = True
                self._body = []
                self._finish_with(refusal)
                return
        if declared is not None and declared.isdigit() and int(declared) > self._server.max_body:
            self._refuse_too_large()
        elif "expect" in headers and headers["expect"].lower() == "100-continue":
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._too_large:
            return
        self._size += len(body)
        if self._size > self._server.max_body:
            self._refuse_too_large()
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._upgrade_ignored:
            return
        parts, url, headers, raw_headers = self._body, self._url, self._mapping, self._headers
        self._in_head = True  # what follows is the next request's head
        self.body_started = 0.0
        self._head_size = self._size = 0
        self._url = b""
        self._headers = []
        self._body = []
        if self._too_large or self._closing:
            self._too_large = False
            return
        parser = self._parser
        keep_alive = parser.should_keep_alive()
        request = Request(
            method_of(parser.get_method()),
            url,
            headers,
            raw_headers,
            parts[0] if len(parts) == 1 else b"".join(parts),
            # HTTP/1.1 unless told otherwise: only a 1.0 client keeps its connection alive by
            # saying so (get_http_version formats a string: not called for the usual request)
            "1.1" if keep_alive and "connection" not in headers else parser.get_http_version(),
            keep_alive,
            self._server.app,
            self,
        )
        self._pending.append(request)
        if self._busy:
            if self._transport is not None:
                self._transport.pause_reading()  # pipelined: one request in flight at a time
        elif self._worker is None:
            self._worker = self._server.loop.create_task(self._work())
        elif self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    # --- writing ---------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self._transport is not None and not self._eof and not self._transport.is_closing():
            self._transport.write(data)

    @property
    def must_drain(self) -> bool:
        return self._paused or self._lost

    async def drain(self) -> None:
        if self._lost:
            raise ConnectionResetError("the client went away")
        if not self._paused:
            return
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._drain)

    # --- request loop ----------------------------------------------------------------------
    async def _work(self) -> None:
        """Serve the connection's requests in order, for as long as it stays open (one task per
        connection, not per request: a task costs more than the wait for the next request)."""
        server = self._server
        loop = server.loop
        while True:
            while not self._pending:
                self._wakeup = loop.create_future()
                try:
                    await self._wakeup
                finally:
                    self._wakeup = None
            request = self._pending.popleft()
            self._busy = True
            server.in_flight += 1
            try:
                try:
                    response = await server.handler(request)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("unhandled error serving %s %s", request.method, request.path)
                    response = server.error_response(500, "internal gateway error")
                    request.keep_alive = False
                if isinstance(response, Response):
                    head = response.head(request.keep_alive and not server.stopping)
                    # a HEAD answer is the GET's head (its content-length too), with no body
                    self.write(head if request.method == "HEAD" else head + response.body)
                elif not response.finished:  # a stream the handler left open
                    await response.write_eof()
            finally:
                self._busy = False
                server.in_flight -= 1
                if not server.in_flight and server.drained is not None:
                    server.drained.set()
            if not self._after(request.keep_alive and not server.stopping):
                self._worker = None
                return

    def _after(self, keep_alive: bool) -> bool:
        """After a response: whether to go on serving this connection."""
        if self._transport is None:
            return False
        if self._closing and self._pending:  # requests read before a refusal: answer them
            return True
        if not keep_alive or self._closing:
            final, self._final = self._final, None
            if final is not None:
                self.write(final.head(keep_alive=False) + final.body)
            self._close()
            return False
        if self._pending:
            self._transport.resume_reading()
        else:
            self.last_active = self._server.loop.time()
        return True

    def _refuse_too_large(self) -> None:
        """Answer 413 now and close once it is written; later body bytes are discarded."""
        self._too_large = True
        self._body = []
        response = self._server.error_response(413, body_too_large(self._server.max_body))
        self._finish_with(response)

    def _reject(self, status: int, message: str) -> None:
        self._finish_with(self._server.error_response(status, message))

    def _finish_with(self, response: Response) -> None:
        """Refuse what is being read: answer every request before it first (pipelined ones
        included, in order), then this, then close; nothing after it is read. Only the first
        refusal is answered."""
        if self._refused:
            return
        self._refused = self._closing = True
        if self._busy or self._pending:
            self._final = response
            return
        self.write(response.head(keep_alive=False) + response.body)
        self._close()

    def _close(self) -> None:
        self._closing = True
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if transport.can_write_eof():
            self._eof = True
            transport.write_eof()  # half-close: the client reads the answer, then closes
            self._server.loop.call_later(2.0, transport.close)
        else:
            transport.close()

    def expire_head(self, started_before: float) -> None:
        """Answer 408 and close if a request's head began before ``started_before`` and is
        still unfinished (a client trickling its head must not hold a connection)."""
        if self._busy or not (self._in_head and self._head_size):
            return
        if self.head_started < started_before:
            self._reject(408, "the request's head took too long to arrive")

    def expire_body(self, started_before: float) -> None:
        """Answer 408 and close if a request's body began before ``started_before`` and is
        still unfinished (a client trickling its body must not hold a connection)."""
        if self._busy or self._in_head or not self.body_started or self._closing:
            return
        if self.body_started < started_before:
            self._too_large = True  # what still arrives is discarded
            self._body = []
            self._reject(408, "the request's body took too long to arrive")

    def close_if_idle(self, idle_since: float | None = None) -> None:
        """Close the connection if no request is in flight (and, given ``idle_since``, nothing
        arrived after it: a half-sent request does not hold a connection forever)."""
        if self._busy or self._pending or self._transport is None:
            return
        if idle_since is None or self.last_active < idle_since:
            self._transport.close()

    def cut_for_shutdown(self) -> bool:
        """Cancel the request in flight, if any, with ``SHUTDOWN_CUT`` as the cancellation's
        message (its handler may still write a last word before the connection closes)."""
        if self._busy and self._worker is not None:
            self._worker.cancel(SHUTDOWN_CUT)
            return True
        return False

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._transport


class HttpServer:
    """Serve ``handler`` on one listening socket."""

    def __init__(
        self,
        app: web.Application,
        handler: Handler,
        error_response: ErrorFactory,
        *,
        max_body: int,
        keepalive: float = 75.0,
        header_timeout: float = 30.0,
        body_timeout: float = 60.0,
        head_check: HeadCheck | None = None,
    ) -> None:
        self.app = app
        self.handler = handler
        self.error_response = error_response
        self.max_body = max_body
        self.keepalive = keepalive
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.head_check = head_check
        self.connections: set[Connection] = set()
        self.in_flight = 0
        self.stopping = False
        self.drained: asyncio.Event | None = None  # set when in_flight reaches 0 while stopping
        self.loop = asyncio.get_running_loop()
        self._server: asyncio.Server | None = None
        self._port = 0
        self._sweeper: asyncio.Task[None] | None = None

    async def start(
        self, host: str, port: int, *, reuse_port: bool = False, tls: ssl.SSLContext | None = None
    ) -> None:
        """Listen; with ``tls``, every connection is HTTPS (a failed handshake never reaches
        the handler)."""
        self._server = await self.loop.create_server(
            lambda: Connection(self), host, port, reuse_port=reuse_port, backlog=2048, ssl=tls
        )
        # uvloop's server is not an asyncio.Server: compiled code must not assume the class
        self._port = int(cast(Any, self._server).sockets[0].getsockname()[1])
        self._sweeper = self.loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        """Close keep-alive connections idle for ``keepalive`` seconds, and answer 408 to those
        whose request head has taken ``header_timeout`` or whose body ``body_timeout`` (one
        timer for all, not per request)."""
        while True:
            period = min(self.keepalive, self.header_timeout, self.body_timeout) / 4
            await asyncio.sleep(min(period, 5.0))
            now = self.loop.time()
            for connection in list(self.connections):
                connection.expire_head(now - self.header_timeout)
                connection.expire_body(now - self.body_timeout)
                connection.close_if_idle(now - self.keepalive)

    @property
    def port(self) -> int:
        """The bound port (also after shutdown)."""
        return self._port

    async def shutdown(self, grace: float) -> None:
        """Stop accepting; close idle connections; wait up to ``grace`` s for handlers."""
        self.stopping = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close_if_idle()
        if self.in_flight:
            self.drained = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.drained.wait(), grace)
        cut = [c for c in list(self.connections) if c.cut_for_shutdown()]
        if cut and self.in_flight:  # their handlers end what they were sending, then close
            drained = self.drained = self.drained or asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(drained.wait(), CUT_WAIT)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        await asyncio.sleep(0)
