"""Poll every endpoint's /metrics on a short interval (GIE uses 50 ms).

A failed scrape leaves the old metrics in place, so they age and the saturation detector
treats the endpoint as saturated once they are stale.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

import aiohttp

from epp.datastore import Datastore
from epp.framework import Endpoint
from epp.metrics_parser import NAMES, parse_metrics
from epp.tasks import cancel_all

log = logging.getLogger("kvgate.epp")
UNHEALTHY_AFTER = 3  # consecutive failed scrapes


class MetricsScraper:
    def __init__(self, datastore: Datastore, interval: float = 0.05, timeout: float = 1.0) -> None:
        self.datastore = datastore
        self.interval = interval
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.errors = 0
        self.on_error: Callable[[Endpoint], None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self.timeout)
        for endpoint in self.datastore.all():
            self._tasks.append(asyncio.create_task(self._poll(endpoint)))

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        if self._session is not None:
            await self._session.close()

    async def scrape_once(self, endpoint: Endpoint) -> bool:
        assert self._session is not None, "start() first"
        names = NAMES.get(self.datastore.engines.get(endpoint.pool, "vllm"), NAMES["vllm"])
        port = endpoint.metrics_port
        address = (
            endpoint.address if port is None else f"{endpoint.address.rsplit(':', 1)[0]}:{port}"
        )
        try:
            async with self._session.get(f"http://{address}/metrics") as response:
                if response.status != 200:
                    raise aiohttp.ClientResponseError(
                        response.request_info, (), status=response.status
                    )
                text = await response.text()
        except (TimeoutError, aiohttp.ClientError) as exc:
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
