"""The least a Python proxy can do, for ``bench_proxy`` to show the floor beside kvgate.

uvloop, httptools on both legs, one pooled keep-alive connection per request in flight,
round-robin over the upstreams, the JSON body parsed once (as any router must to read
``model``), the upstream's bytes passed through untouched. No auth, limits, metrics, retries,
timeouts, picking or usage accounting, and no error handling: a benchmark peer only.

``python -m bench.floor_proxy PORT UPSTREAM_PORT[,UPSTREAM_PORT...]``
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from typing import cast

import httptools
import orjson
import uvloop


class _Upstream(asyncio.Protocol):
    def __init__(self, idle: list[_Upstream]) -> None:
        self.idle = idle
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.client: _Client | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.client is not None and self.client.transport is not None:
            self.client.transport.write(data)
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        self.idle.append(self)
        if client is not None:
            client.done()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.idle:
            self.idle.remove(self)


class _Client(asyncio.Protocol):
    def __init__(self, upstreams: list[tuple[str, int]], pools: dict[int, list[_Upstream]]) -> None:
        self.upstreams = upstreams
        self.pools = pools
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, self.body = b"".join(self.body), []
        method = self.parser.get_method().decode()
        asyncio.get_running_loop().create_task(self.forward(method, body))

    async def forward(self, method: str, body: bytes) -> None:
        if body:
            orjson.loads(body)  # a router reads the model name
        index = next(_ROUND_ROBIN) % len(self.upstreams)
        idle = self.pools[index]
        if idle:
            upstream = idle.pop()
        else:
            host, port = self.upstreams[index]
            loop = asyncio.get_running_loop()
            _, upstream = await loop.create_connection(lambda: _Upstream(idle), host, port)
        self.waiter = asyncio.get_running_loop().create_future()
        upstream.client = self
        head = f"{method} {self.url.decode()} HTTP/1.1\r\nhost: upstream\r\n"
        head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        assert upstream.transport is not None
        upstream.transport.write(head.encode() + body)
        await self.waiter

    def done(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


_ROUND_ROBIN = itertools.count()


async def serve(port: int, upstream_ports: list[int]) -> None:
    upstreams = [("127.0.0.1", p) for p in upstream_ports]
    pools: dict[int, list[_Upstream]] = {i: [] for i in range(len(upstreams))}
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(upstreams, pools), "127.0.0.1", port)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), [int(p) for p in sys.argv[2].split(",")]))
