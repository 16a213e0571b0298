"""kvgate's own HTTP layers (``kvgate.wire.http``: the server and the upstream pool) with a trivial
handler, for ``bench_proxy``: between the python floor and the full gateway, it shows what the
layers cost and what the gateway's per-request work costs.

The handler parses the body, sends it round robin to the upstreams and returns the answer;
no auth, routing, admission, picking, retries, metrics or usage. A benchmark peer only.

``python -m bench.layers_proxy PORT UPSTREAM_PORT[,UPSTREAM_PORT...]``
"""

from __future__ import annotations

import asyncio
import itertools
import sys

import orjson
import uvloop
from aiohttp import web

from gateway.request.error_responses import http_error
from kvgate.wire.http.connection_pool import ConnectionPool
from kvgate.wire.http.messages import Request, Response
from kvgate.wire.http.server import HttpServer


async def serve(port: int, upstream_ports: list[int]) -> None:
    upstreams = [f"127.0.0.1:{p}" for p in upstream_ports]
    turn = itertools.count()
    pool = ConnectionPool(connect_timeout=1.0)

    async def handler(request: Request) -> Response:
        if request.body:
            orjson.loads(request.body)  # a router reads the model name
        upstream = await pool.request(
            upstreams[next(turn) % len(upstreams)],
            request.method,
            request.path,
            b"content-type: application/json\r\n",
            request.body,
            first_byte=60.0,
        )
        try:
            data = await upstream.read(60.0)
        finally:
            upstream.close()
        return Response(data, status=upstream.status, content_type=upstream.content_type)

    server = HttpServer(web.Application(), handler, http_error, max_body=1 << 20)
    await server.start("127.0.0.1", port)
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), [int(p) for p in sys.argv[2].split(",")]))
