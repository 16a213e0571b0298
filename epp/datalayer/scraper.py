"""Poll every endpoint's /metrics on a short interval while what it reports matters to the
next decision (GIE polls every 50 ms), and slowly while the picker's own counts already say it,
so the scraping cost follows the load.

An endpoint is *accounted for* when its last scrape showed nothing this picker does not know
of, far from saturation: nothing waiting, no more running than this picker has in flight there,
KV usage under half the saturation threshold, and fewer than half the saturation queue sent
there since and not over yet (``accounted``). An idle endpoint is the plain case. Until
something else reaches it, what a scrape would show is what the picker already counts (its
in-flight requests, the tokens it sent), so it is polled every ``idle_interval`` (to notice other
routers' traffic and deaths) and the saturation detector accepts its metrics as fresh for that
much longer (``Endpoint.metrics_grace``). While scrape after scrape finds it accounted for
(nothing from elsewhere reached it), that rest doubles, up to ``quiet_interval``; a scrape that
finds more sets it back. A pick sent there changes nothing while the endpoint stays accounted
for: the picker counts what it sent (in flight, tokens, and toward the saturation check's queue
while open since the scrape); one that leaves it no longer accounted for (a burst: half the
saturation queue open since the scrape) cuts the rest to one busy interval.

Any other endpoint (a queue, KV pressure, requests the picker did not send) is scraped again
one busy interval after its last scrape if something has read the metrics since (a pick, or
the admission gate while it holds requests back: ``metrics_read``); otherwise at the next read
or after the idle interval, whichever comes first, with the same grace. A scrape that no
decision reads is work for nothing on both sides; at a high rate (a read every busy interval
or more often) the busy interval is kept.

A scrape asks for only the series the picker reads (``/metrics?name[]=...``, the filter of
prometheus_client's own exposition; a vLLM /metrics runs hundreds of lines, and the server
renders them all for every poll). A server that ignores the filter answers with everything,
which parses the same. An endpoint's first scrape checks that the filtered answer has the
running or waiting series; if not, and the whole text has it, that endpoint is scraped whole
from then on (a server whose filter drops what it serves, or that refuses the query).

An answer the same as the endpoint's last (an idle server's, as a rule) is not parsed again:
the metrics it parsed to are marked as of now.

With ``--workers N`` each worker's scrapes reach the others
(``epp.requestcontrol.pick_exchange``), which ``adopt`` them: a poller whose endpoint got a
sibling's scrape while it rested rests again instead of scraping, so of N workers polling in
step, one scrapes. (A sibling's requests are not this picker's own: an endpoint running them is
not accounted for.)

A failed scrape leaves the old metrics in place and drops the grace, so they age and the
saturation detector treats the endpoint as saturated once they are stale.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import replace
from urllib.parse import quote

from epp.datalayer.datastore import Datastore
from epp.datalayer.doorbell import Doorbell
from epp.datalayer.measured_capacity import DecodeSpeeds
from epp.datalayer.metrics_parser import VLLM, MetricNames, parse_metrics
from epp.datalayer.tasks import cancel_all
from epp.framework import Endpoint, EndpointMetrics
from kvgate.wire.http.client import UpstreamConnectionError
from kvgate.wire.http.connection_pool import ConnectionPool
from policies.schema import Saturation

log = logging.getLogger("kvgate.epp")
UNHEALTHY_AFTER = 3  # consecutive failed scrapes
_ACCEPT = b"accept: text/plain\r\n"  # the header lines of a scrape
WHOLE = "/metrics"
MAX_SCRAPE_BYTES = 16 << 20  # a /metrics answer past this fails the scrape (vLLM's: ~100 KiB)


def filtered_path(names: MetricNames) -> str:
    """``/metrics`` restricted to the series in ``names``."""
    return WHOLE + "?" + "&".join(f"name%5B%5D={quote(name, safe='')}" for name in names.series())


class ScrapeError(Exception):
    """The endpoint answered, but not with its metrics."""


async def fetch_metrics(pool: ConnectionPool, address: str, path: str, idle: float) -> str:
    """One scrape's text over ``pool``'s kept-alive connections (``ScrapeError`` for a status
    other than 200; ``idle``: seconds to the first byte, and for each gap while reading)."""
    response = await pool.request(address, "GET", path, _ACCEPT, b"", first_byte=idle)
    try:
        if response.status != 200:
            raise ScrapeError(f"HTTP {response.status}")
        body = await response.read(idle, MAX_SCRAPE_BYTES)
    finally:
        response.close()
    return body.decode("utf-8", errors="replace")


class Poller:
    """What the scraper keeps of one endpoint between its scrapes (a plain slots class)."""

    __slots__ = ("accounted_in_a_row", "bell", "last", "path", "reads_at_scrape")

    def __init__(self) -> None:
        self.bell = Doorbell()  # rung by a pick sent there
        self.path: str | None = None  # where it is scraped, once its first scrape has decided
        self.reads_at_scrape = 0  # the scraper's metrics reads when it was last scraped
        self.accounted_in_a_row = 0  # scrapes in a row that found it accounted for
        # its last answer and what it parsed to: an idle endpoint answers the same text scrape
        # after scrape, which then needs no parsing
        self.last: tuple[str, EndpointMetrics] | None = None


class MetricsScraper:
    """Scrapes every endpoint's /metrics into the datastore, with backoff for dead endpoints."""

    def __init__(
        self,
        datastore: Datastore,
        interval: float = 0.05,
        timeout: float = 1.0,
        idle_interval: float = 0.0,
        quiet_interval: float = 0.0,
        saturation: Saturation | None = None,
    ) -> None:
        self.datastore = datastore
        self.interval = interval
        self.idle_interval = max(idle_interval, interval)  # 0 (or less): never slow down
        self.quiet_interval = max(quiet_interval, self.idle_interval)
        thresholds = saturation or Saturation()
        self._calm_kv_usage = thresholds.kv_usage / 2
        self._calm_dispatched = thresholds.queue_depth / 2
        self._pollers: dict[int, Poller] = {}  # by id(endpoint)
        self.timeout = timeout  # connect, first byte, and each gap while reading
        self.errors = 0
        self.on_error: Callable[[Endpoint], None] | None = None
        self.on_scrape: Callable[[Endpoint], None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pool: ConnectionPool | None = None
        self.scrapes = 0  # successful scrapes, all endpoints
        self.tls: dict[str, tuple[ssl.SSLContext, str]] = {}  # https:// endpoints, by address
        self.reads = 0  # metrics_read calls
        self.adopted_rests = 0  # rests after which a sibling's scrape stood for this one's
        self._read = Doorbell()
        self.speeds = DecodeSpeeds()  # for the pools whose capacity is measured

    async def start(self) -> None:
        # the gateway's raw keep-alive client: a scrape costs ~5x less CPU than with aiohttp's
        self._pool = ConnectionPool(connect_timeout=self.timeout)
        for endpoint in self.datastore.all():
            tls = self.tls.get(endpoint.address)
            if tls is not None:
                self._pool.use_tls(self._scrape_address(endpoint), *tls)
            self._tasks.append(asyncio.create_task(self._poll(endpoint)))

    def wake(self, endpoint: Endpoint) -> None:
        """A pick sent ``endpoint`` a request: poll it at the busy interval again."""
        poller = self._pollers.get(id(endpoint))
        if poller is not None:
            poller.bell.ring()

    def metrics_read(self) -> None:
        """Something has read the endpoints' metrics to decide (a pick, a holding admission
        gate): a busy endpoint is worth scraping again."""
        self.reads += 1
        self._read.ring()

    def adopt(self, endpoint: Endpoint, metrics: EndpointMetrics) -> None:
        """``metrics`` are a fresh scrape of ``endpoint``: this picker's own, or a sibling
        worker's (which see this picker's requests as much as its own scrape would; its poller
        then skips its next scrape of that endpoint)."""
        endpoint.metrics = metrics
        endpoint.load.dispatched = 0
        if endpoint.pool in self.datastore.measured:
            self.speeds.observe(endpoint, self.datastore.endpoints(endpoint.pool))

    def accounted(self, endpoint: Endpoint) -> bool:
        """What the endpoint's last scrape showed is this picker's own doing, far from
        saturation: nothing waiting, no more running than this picker has in flight there, KV
        usage under half the saturation threshold, and fewer than half the saturation queue
        sent there since and not over yet."""
        m = endpoint.metrics
        return (
            not m.waiting
            and m.running <= endpoint.in_flight
            and m.kv_usage < self._calm_kv_usage
            and endpoint.load.dispatched < self._calm_dispatched
        )

    def slow_rest(self, endpoint: Endpoint) -> float:
        """How long an accounted-for endpoint rests: the idle interval, doubled for each scrape
        in a row past the first that found it accounted for, up to the quiet interval."""
        doublings = max(self._poller(endpoint).accounted_in_a_row - 1, 0)
        return min(self.idle_interval * (1 << min(doublings, 30)), self.quiet_interval)

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        if self._pool is not None:
            self._pool.close()

    async def _get(self, address: str, path: str) -> str:
        assert self._pool is not None, "start() first"
        return await fetch_metrics(self._pool, address, path, self.timeout)

    async def scrape_once(self, endpoint: Endpoint) -> bool:
        names = self.datastore.metric_names.get(endpoint.pool, VLLM)
        address = self._scrape_address(endpoint)
        poller = self._poller(endpoint)
        poller.reads_at_scrape = self.reads
        try:
            if poller.path is None:
                text = await self._first_scrape(poller, address, names)
            else:
                text = await self._get(address, poller.path)
        except (TimeoutError, UpstreamConnectionError, ScrapeError) as exc:
            self.errors += 1
            if self.on_error is not None:
                self.on_error(endpoint)
            log.debug("scrape of %s failed: %s", address, exc)
            endpoint.metrics_grace = 0.0
            return False
        self.adopt(endpoint, _metrics_of(poller, text, names))
        accounted = self.accounted(endpoint)
        poller.accounted_in_a_row = poller.accounted_in_a_row + 1 if accounted else 0
        self.scrapes += 1
        if self.on_scrape is not None:
            self.on_scrape(endpoint)
        return True

    def _poller(self, endpoint: Endpoint) -> Poller:
        poller = self._pollers.get(id(endpoint))
        if poller is None:
            poller = self._pollers[id(endpoint)] = Poller()
        return poller

    async def _first_scrape(self, poller: Poller, address: str, names: MetricNames) -> str:
        """Scrape filtered, unless the filtered answer lacks the series the whole text has;
        remember which for the endpoint's later scrapes."""
        path = filtered_path(names)
        try:
            text = await self._get(address, path)
            if names.running in text or names.waiting in text:
                poller.path = path
                return text
        except ScrapeError:
            pass  # a server that refuses the query may serve the whole text
        text = await self._get(address, WHOLE)
        whole = names.running in text or names.waiting in text
        poller.path = WHOLE if whole else path
        if whole:
            log.info("%s answers a filtered scrape without its series: scraping it whole", address)
        return text

    @staticmethod
    def _scrape_address(endpoint: Endpoint) -> str:
        port = endpoint.spec.metrics_port
        return endpoint.address if port is None else f"{endpoint.address.rsplit(':', 1)[0]}:{port}"

    async def _rest(self, endpoint: Endpoint) -> None:
        """Wait until the next scrape of a healthy endpoint: the slow rest while it is
        accounted for, else the busy interval (longer while nothing reads its metrics)."""
        poller = self._poller(endpoint)
        if self.idle_interval <= self.interval:
            endpoint.metrics_grace = 0.0
            await asyncio.sleep(self.interval)
        elif self.accounted(endpoint):
            await self._rest_accounted(endpoint, poller.bell)
        else:
            await self._rest_busy(endpoint, poller)

    async def _rest_accounted(self, endpoint: Endpoint, bell: Doorbell) -> None:
        """The slow rest; a pick sent there that leaves the endpoint no longer accounted for
        cuts it to one busy interval (one that leaves it accounted for changes nothing)."""
        loop = asyncio.get_running_loop()
        rest = self.slow_rest(endpoint)
        endpoint.metrics_grace = rest
        deadline = loop.time() + rest
        while (left := deadline - loop.time()) > 0:
            if not await bell.wait(left):
                return
            if not self.accounted(endpoint):
                await asyncio.sleep(self.interval)
                return

    async def _rest_busy(self, endpoint: Endpoint, poller: Poller) -> None:
        endpoint.metrics_grace = 0.0
        await asyncio.sleep(self.interval)
        if self.reads != poller.reads_at_scrape:
            return
        endpoint.metrics_grace = self.idle_interval
        await self._read.wait(self.idle_interval - self.interval)

    async def _poll(self, endpoint: Endpoint) -> None:
        failures = 0
        while True:
            failures = 0 if await self.scrape_once(endpoint) else failures + 1
            endpoint.healthy = failures < UNHEALTHY_AFTER
            if not failures:
                while True:
                    resting_since = time.monotonic()
                    await self._rest(endpoint)
                    if endpoint.metrics.scraped_at <= resting_since:
                        break  # no sibling worker's scrape came meanwhile: scrape it here
                    self.adopted_rests += 1
                continue
            # a dead endpoint is retried with exponential backoff (up to 5 s), not hammered, and
            # jittered, so endpoints that died together are not all retried in one burst
            backoff = min(self.interval * 2 ** min(failures, 10), max(self.interval, 5.0))
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))


def _metrics_of(poller: Poller, text: str, names: MetricNames) -> EndpointMetrics:
    """What ``text``, the endpoint's answer just now, says: the last answer's metrics as of now
    if it is the same (a new snapshot: one already handed out is never changed)."""
    last = poller.last
    if last is not None and last[0] == text:
        metrics = replace(last[1], scraped_at=time.monotonic())
    else:
        metrics = parse_metrics(text, names)
    poller.last = (text, metrics)
    return metrics
