"""Poll every endpoint's /metrics on a short interval (GIE uses 50 ms).

A failed scrape leaves the old metrics in place, so they age and the saturation detector
treats the endpoint as saturated once they are stale.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from epp.datastore import Datastore
from epp.framework import Endpoint
from epp.metrics_parser import VLLM, parse_metrics
from epp.tasks import cancel_all
from kvgate.wire.http.client import ConnectionPool, UpstreamConnectionError

log = logging.getLogger("kvgate.epp")
UNHEALTHY_AFTER = 3  # consecutive failed scrapes
_ACCEPT = b"accept: text/plain\r\n"  # the header lines of a scrape


class ScrapeError(Exception):
    """The endpoint answered, but not with its metrics."""


class MetricsScraper:
    """Scrapes every endpoint's /metrics into the datastore, with backoff for dead endpoints."""

    def __init__(self, datastore: Datastore, interval: float = 0.05, timeout: float = 1.0) -> None:
        self.datastore = datastore
        self.interval = interval
        self.timeout = timeout  # connect, first byte, and each gap while reading
        self.errors = 0
        self.on_error: Callable[[Endpoint], None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pool: ConnectionPool | None = None

    async def start(self) -> None:
        # the gateway's raw keep-alive client: a scrape costs ~5x less CPU than with aiohttp's
        self._pool = ConnectionPool(connect_timeout=self.timeout)
        for endpoint in self.datastore.all():
            self._tasks.append(asyncio.create_task(self._poll(endpoint)))

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        if self._pool is not None:
            self._pool.close()

    async def _get(self, address: str) -> str:
        assert self._pool is not None, "start() first"
        response = await self._pool.request(
            address, "GET", "/metrics", _ACCEPT, b"", first_byte=self.timeout
        )
        try:
            if response.status != 200:
                raise ScrapeError(f"HTTP {response.status}")
            body = await response.read(self.timeout)
        finally:
            response.close()
        return body.decode("utf-8", errors="replace")

    async def scrape_once(self, endpoint: Endpoint) -> bool:
        names = self.datastore.metric_names.get(endpoint.pool, VLLM)
        port = endpoint.metrics_port
        address = (
            endpoint.address if port is None else f"{endpoint.address.rsplit(':', 1)[0]}:{port}"
        )
        try:
            text = await self._get(address)
        except (TimeoutError, UpstreamConnectionError, ScrapeError) as exc:
            self.errors += 1
            if self.on_error is not None:
                self.on_error(endpoint)
            log.debug("scrape of %s failed: %s", address, exc)
            return False
        endpoint.metrics = parse_metrics(text, names)
        endpoint.dispatched = 0
        return True

    async def _poll(self, endpoint: Endpoint) -> None:
        failures = 0
        while True:
            failures = 0 if await self.scrape_once(endpoint) else failures + 1
            endpoint.healthy = failures < UNHEALTHY_AFTER
            if not failures:
                await asyncio.sleep(self.interval)
                continue
            # a dead endpoint is retried with exponential backoff (up to 5 s), not hammered, and
            # jittered, so endpoints that died together are not all retried in one burst
            backoff = min(self.interval * 2 ** min(failures, 10), max(self.interval, 5.0))
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
