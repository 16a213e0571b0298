"""The gateway's request path without sockets, for a measure that this shared machine's noise
does not blur: ``make bench-inprocess``.

The real application (``create_app``), kvgate's HTTP server and routes, and the real upstream
pool run on uvloop; only the transports are in memory: each client connection sends the next
chat completion as soon as its answer is written, and each upstream connection answers at once
with the mock upstream's JSON body (``--stream``: streamed chat completions, the upstream
sending the mock's 16 SSE chunks, a usage chunk and ``[DONE]`` one per turn of the event loop,
as tokens arrive). What is left is the gateway's own user-space work per
request: parsing, context, auth, routing, admission, picking, the upstream call, usage,
metrics. ``--peer layers`` runs kvgate's HTTP layers with a trivial handler instead.

``python -m bench.inprocess [--requests N] [--peer kvgate|layers] [--label L]
[--stream]`` prints CPU microseconds per request; ``bench.instructions`` runs it under
valgrind and reports instructions per request, which are the same from run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import time
from typing import Any, cast

import orjson
import uvloop
from aiohttp import web

from bench.mock_upstream import BODY, STREAM, USAGE_CHUNK
from gateway.app import create_app
from gateway.request.error_responses import http_error
from gateway.request.routes import handle
from gateway.request.state import STATE
from kvgate.wire.http import messages
from kvgate.wire.http.client import UpstreamConnection, UpstreamResponse
from kvgate.wire.http.connection_pool import ConnectionPool
from kvgate.wire.http.messages import Request, Response
from kvgate.wire.http.server import Connection, Handler, HttpServer
from loadtest.workloads.fixed import CHAT
from policies.loader import load_policy_text

# The layers peer's upstream header lines: encoded since fedb3e5; pairs in the older checkouts
# that ``bench_instructions --against`` runs this harness in.
JSON_HEADERS: Any = b"content-type: application/json\r\n"
if not hasattr(messages, "header_block"):
    JSON_HEADERS = [("content-type", "application/json")]
UPSTREAMS_ADDRESSES = ("127.0.0.1:1", "127.0.0.1:2")  # never connected: transports in memory
CONNECTIONS = 8  # client connections, each with one request in flight
POLICY = f"""
pools: {{mocks: {{endpoints: [{", ".join(UPSTREAMS_ADDRESSES)}]}}}}
routes: [{{model: mock, pool: mocks{{route}}}}]
observability: {{access_log: "off"}}
epp: {{picker: least-in-flight}}
"""
# --feature NAME: the policy uses one optional part, to measure what it costs when used:
# (what the route adds, a section of the policy)
FEATURES = {
    "slos": (
        "",
        "slos: {objectives: [{route: mock, ttft_p95: 500ms, tpot_p95: 40ms, availability: 99.9%}]}",
    ),
    "cache": (", cache: true", ""),  # the harness's chat request is greedy: hits after the first
    "spend": (
        "",
        "spend: {prices: {mock: {input: 0.2, cached_input: 0.05, output: 0.6}}, "
        "budgets: [{tenant: '*', per: day, limit: 1000000000}]}",
    ),
    "explain": (", explain: {tenants: ['*'], sample: 0.01}", ""),
}


def policy_text(feature: str | None = None) -> str:
    """The harness's policy, with ``feature`` (a key of ``FEATURES``) in use."""
    route, section = FEATURES[feature] if feature else ("", "")
    return POLICY.replace("{route}", route) + section + "\n"


_BODY = orjson.dumps(CHAT)
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
)
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
    b"Content-Length: %d\r\nDate: Sun, 29 Nov 2026 17:00:00 GMT\r\n"
    b"Server: Python/3.11 aiohttp/3.14.5\r\n\r\n%s" % (len(BODY), BODY)
)

_STREAM_BODY = orjson.dumps({**CHAT, "stream": True})
STREAM_REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    % (len(_STREAM_BODY), _STREAM_BODY)
)
# the head, then each event in its own chunk and read: one per token, as a server streams them
STREAM_READS = [
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\nDate: Sun, 29 Nov 2026 17:00:00 GMT\r\n\r\n",
    *(b"%x\r\n%b\r\n" % (len(e), e) for e in [*STREAM, USAGE_CHUNK, b"data: [DONE]\n\n"]),
    b"0\r\n\r\n",
]


class _MemoryTransport:
    """The few transport calls the server and the pool make."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def is_closing(self) -> bool:
        return False

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _UpstreamTransport(_MemoryTransport):
    """An upstream that answers every request with the mock's body."""

    def __init__(self, conn: UpstreamConnection) -> None:
        super().__init__()
        self.conn = conn

    def write(self, data: bytes) -> None:
        if data.find(b'"stream":true') >= 0:  # not ``in``: see kvgate.wire.sse
            self.loop.call_soon(self._stream, 0)
        else:
            self.loop.call_soon(self.conn.data_received, RESPONSE)

    def _stream(self, read: int) -> None:
        self.conn.data_received(STREAM_READS[read])
        if read + 1 < len(STREAM_READS):
            self.loop.call_soon(self._stream, read + 1)


class _ClientTransport(_MemoryTransport):
    """A client that sends the next request when an answer is written, until ``total``."""

    def __init__(self, conn: Connection, run: _Run, request: bytes) -> None:
        super().__init__()
        self.conn = conn
        self.run = run
        self.request = request
        self.streaming = request is STREAM_REQUEST

    def write(self, data: bytes) -> None:
        if data.startswith(b"HTTP/1.1 ") and not data.startswith(b"HTTP/1.1 200"):
            self.run.fail(data)
        elif self.streaming and not data.endswith(b"0\r\n\r\n"):
            return  # the head or an event: the answer goes on
        elif self.run.answered():
            self.loop.call_soon(self.conn.data_received, self.request)


class _Run:
    def __init__(self, total: int) -> None:
        self.total = total
        self.count = 0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def answered(self) -> bool:
        """Count an answer; whether to send another request."""
        self.count += 1
        if self.count >= self.total and not self.done.done():
            self.done.set_result(None)
        return self.count < self.total

    def fail(self, data: bytes) -> None:
        if not self.done.done():
            self.done.set_exception(RuntimeError(f"unexpected answer: {data[:200]!r}"))


def _layers_handler(pool: ConnectionPool) -> Handler:
    turn = itertools.count()

    async def handler(request: Request) -> Response:
        orjson.loads(request.body)
        address = UPSTREAMS_ADDRESSES[next(turn) % len(UPSTREAMS_ADDRESSES)]
        headers = JSON_HEADERS
        upstream: UpstreamResponse = await pool.request(
            address, request.method, request.path, headers, request.body, first_byte=60.0
        )
        try:
            data = await upstream.read(60.0)
        finally:
            upstream.close()
        return Response(data, status=upstream.status, content_type=upstream.content_type)

    return handler


async def measure(
    requests: int, peer: str, feature: str | None = None, stream: bool = False
) -> float:
    """CPU seconds per request over ``requests`` requests (after 500 of warm-up)."""
    app = create_app(load_policy_text(policy_text(feature)))
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    try:
        pool = app[STATE].parts.upstreams
        for address in UPSTREAMS_ADDRESSES:
            for _ in range(2 * CONNECTIONS):  # idle upstream connections: none is dialled
                conn = UpstreamConnection(pool, address)
                conn.connection_made(cast(asyncio.Transport, _UpstreamTransport(conn)))
                pool.put_back(conn)
        handler = handle if peer == "kvgate" else _layers_handler(pool)
        server = HttpServer(app, handler, http_error, max_body=1 << 20)
        request = STREAM_REQUEST if stream else REQUEST
        await _drive(server, 500, request)
        gc.freeze()  # as a gateway worker does once it listens
        started = time.process_time()
        await _drive(server, requests, request)
        return (time.process_time() - started) / requests
    finally:
        await runner.cleanup()


async def _drive(server: HttpServer, requests: int, request: bytes) -> None:
    run = _Run(requests)
    connections = []
    for _ in range(CONNECTIONS):
        conn = Connection(server)
        conn.connection_made(cast(asyncio.Transport, _ClientTransport(conn, run, request)))
        connections.append(conn)
    for conn in connections:
        conn.data_received(request)
    await run.done
    for conn in connections:
        conn.connection_lost(None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--peer", choices=["kvgate", "layers"], default="kvgate")
    parser.add_argument("--label", help="the name to print (default: the peer's)")
    parser.add_argument("--feature", choices=sorted(FEATURES), help="with this part in use")
    parser.add_argument("--stream", action="store_true", help="streamed chat completions")
    args = parser.parse_args()
    if args.stream and args.peer != "kvgate":
        parser.error("--stream measures kvgate only")
    seconds = uvloop.run(measure(args.requests, args.peer, args.feature, args.stream))
    label = args.label or args.peer
    print(f"{label}: {seconds * 1e6:.1f} us of CPU per request over {args.requests:,}")


if __name__ == "__main__":
    main()
