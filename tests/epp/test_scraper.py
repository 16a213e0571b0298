"""The metrics scraper against real HTTP endpoints: fresh metrics, failures, health."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from epp.datalayer.datastore import Datastore
from epp.datalayer.metrics_parser import VLLM, MetricNames, parse_metrics
from epp.datalayer.scraper import MetricsScraper
from epp.framework import Endpoint, EndpointLoad, EndpointMetadata, EndpointMetrics
from kvgate.in_flight import InFlight
from loadtest.harness.processes import free_port
from policies.loader import load_policy_text
from tests.http_servers import serving


@pytest.fixture
async def metrics_server() -> AsyncIterator[int]:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text='vllm:num_requests_waiting{model_name="m"} 4.0\n'
                                 'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n')  # fmt: skip

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with serving(app) as port:
        yield port


async def test_scrapes_live_endpoints_and_marks_dead_ones_unhealthy(metrics_server: int) -> None:
    dead = free_port()
    policy = load_policy_text(f"pools: {{p: {{endpoints: [127.0.0.1:{metrics_server}, 127.0.0.1:{dead}]}}}}\n"
                              "routes: [{model: m, pool: p}]\n")  # fmt: skip
    datastore = Datastore(policy)
    scraper = MetricsScraper(datastore, interval=0.01)
    await scraper.start()
    try:
        await asyncio.sleep(0.5)
    finally:
        await scraper.stop()
    live, gone = datastore.endpoints("p")
    assert (live.metrics.waiting, live.metrics.kv_usage) == (4, 0.25) and live.healthy
    assert live.metrics.age() < 0.5
    assert not gone.healthy and gone.metrics.scraped_at == 0.0 and scraper.errors >= 3


@pytest.fixture
async def switchable_server() -> AsyncIterator[tuple[int, dict[str, float]]]:
    """/metrics whose running count the test sets; counts the scrapes."""
    state = {"running": 0.0, "scrapes": 0.0}

    async def metrics(request: web.Request) -> web.Response:
        state["scrapes"] += 1
        return web.Response(
            text=f'vllm:num_requests_running{{model_name="m"}} {state["running"]}\n'
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with serving(app) as port:
        yield port, state


def one_endpoint_scraper(
    port: int, idle_interval: float, quiet_interval: float = 0.0
) -> MetricsScraper:
    """A scraper polling 127.0.0.1:``port`` every 20 ms while busy (not started)."""
    policy = load_policy_text(
        f"pools: {{p: {{endpoints: [127.0.0.1:{port}]}}}}\nroutes: [{{model: m, pool: p}}]\n"
    )
    return MetricsScraper(
        Datastore(policy),
        interval=0.02,
        idle_interval=idle_interval,
        quiet_interval=quiet_interval,
    )


async def until_running(endpoint: Endpoint, running: int) -> None:
    """Until the endpoint's scraped metrics show ``running`` requests (at most a second)."""
    for _ in range(200):
        if endpoint.metrics.running == running:
            return
        await asyncio.sleep(0.005)


async def test_idle_endpoints_are_scraped_slowly_and_a_pick_wakes_them(
    switchable_server: tuple[int, dict[str, float]],
) -> None:
    from epp.scheduling.saturation import SaturationDetector

    port, state = switchable_server
    scraper = one_endpoint_scraper(port, idle_interval=0.4)
    (endpoint,) = scraper.datastore.endpoints("p")
    await scraper.start()
    try:
        await asyncio.sleep(0.1)
        state["scrapes"] = 0
        await asyncio.sleep(1.0)
        idle_scrapes = state["scrapes"]
        assert 1 <= idle_scrapes <= 4  # every 0.4 s, not every 0.02 s (50 in 1 s)
        assert endpoint.metrics_grace == 0.4
        # metrics up to 0.4 s + max_metrics_age old still count as fresh for an idle endpoint
        detector = SaturationDetector()
        assert detector.unsaturated([endpoint], endpoint.metrics.scraped_at + 0.5) == [endpoint]
        assert detector.unsaturated([endpoint], endpoint.metrics.scraped_at + 0.7) == []

        state["running"] = 2  # another router's traffic: seen at the next idle scrape at worst
        endpoint.in_flight, endpoint.load.dispatched = 1, 1  # what EppService.dispatched does
        woken_at = asyncio.get_running_loop().time()
        scraper.wake(endpoint)
        await until_running(endpoint, 2)
        assert asyncio.get_running_loop().time() - woken_at < 0.5  # the idle interval at most
        state["scrapes"] = 0
        for _ in range(50):  # picks read the metrics every 10 ms
            scraper.metrics_read()
            await asyncio.sleep(0.01)
        assert state["scrapes"] >= 10  # more running than sent from here, and read: every 0.02 s
    finally:
        await scraper.stop()


async def test_an_endpoint_only_this_picker_uses_is_polled_ever_more_slowly(
    switchable_server: tuple[int, dict[str, float]],
) -> None:
    port, state = switchable_server
    scraper = one_endpoint_scraper(port, idle_interval=0.1, quiet_interval=0.4)
    (endpoint,) = scraper.datastore.endpoints("p")
    await scraper.start()
    try:
        await asyncio.sleep(0.8)  # 0.1, 0.2, 0.4 s rests
        assert scraper.slow_rest(endpoint) == 0.4
        state["scrapes"] = 0
        await asyncio.sleep(1.0)
        assert 1 <= state["scrapes"] <= 4  # every 0.4 s, not every 0.1 s
        assert endpoint.metrics_grace == 0.4

        # this picker's own requests running there change nothing: reads do not speed it up
        endpoint.in_flight = 2
        state["running"] = 2
        await until_running(endpoint, 2)
        state["scrapes"] = 0
        for _ in range(50):
            scraper.metrics_read()
            await asyncio.sleep(0.01)
        assert state["scrapes"] <= 3 and scraper.slow_rest(endpoint) == 0.4

        # one more than it sent: someone else's traffic, polled busy while read
        state["running"] = 3
        await until_running(endpoint, 3)
        state["scrapes"] = 0
        for _ in range(30):
            scraper.metrics_read()
            await asyncio.sleep(0.01)
        assert state["scrapes"] >= 6
        assert scraper.slow_rest(endpoint) == 0.1  # and slow polling starts over after it
    finally:
        await scraper.stop()


async def test_a_pick_leaves_a_quiet_endpoint_resting_but_a_burst_is_seen_at_once(
    switchable_server: tuple[int, dict[str, float]],
) -> None:
    port, state = switchable_server
    scraper = one_endpoint_scraper(port, idle_interval=0.1, quiet_interval=0.8)
    (endpoint,) = scraper.datastore.endpoints("p")
    loop = asyncio.get_running_loop()
    await scraper.start()
    try:
        await asyncio.sleep(1.0)  # rests of 0.1, 0.2 and 0.4 s: now 0.8 s ones
        state["scrapes"] = 0
        for _ in range(400):  # until the next scrape: a rest of 0.8 s starts then
            if state["scrapes"]:
                break
            await asyncio.sleep(0.005)
        state["running"] = 1
        endpoint.in_flight, endpoint.load.dispatched = 1, 1  # one pick: the picker counts it
        scraper.wake(endpoint)
        await asyncio.sleep(0.3)
        assert state["scrapes"] == 1 and endpoint.metrics.running == 0  # not scraped for it
        assert scraper.slow_rest(endpoint) == 0.8

        await until_running(endpoint, 1)  # at the end of the rest
        assert endpoint.load.dispatched == 0  # the saturation check's queue counts it no longer
        state["running"] = 4  # a burst: half the saturation queue open since the last scrape
        endpoint.in_flight, endpoint.load.dispatched = 4, 3
        woken_at = loop.time()
        scraper.wake(endpoint)
        await until_running(endpoint, 4)
        assert loop.time() - woken_at < 0.09  # one busy interval, not the rest of 0.8 s
    finally:
        await scraper.stop()


@pytest.mark.parametrize(
    ("metrics", "in_flight", "dispatched", "accounted"),
    [
        (EndpointMetrics(), 0, 0, True),  # idle
        (EndpointMetrics(running=2), 2, 0, True),  # all of it sent from here
        (EndpointMetrics(running=2), 1, 0, False),  # one from elsewhere (or just finished)
        (EndpointMetrics(waiting=1, running=1), 2, 0, False),  # a queue
        (EndpointMetrics(kv_usage=0.39), 0, 0, True),  # under half of 80%
        (EndpointMetrics(kv_usage=0.4), 0, 0, False),
        (EndpointMetrics(), 2, 2, True),  # under half of a queue of 5 open since the scrape
        (EndpointMetrics(), 3, 3, False),
    ],
)
def test_accounted_for_means_the_pickers_own_doing_far_from_saturation(
    metrics: EndpointMetrics, in_flight: int, dispatched: int, accounted: bool
) -> None:
    policy = load_policy_text(
        "pools: {p: {endpoints: [127.0.0.1:1]}}\nroutes: [{model: m, pool: p}]\n"
    )
    scraper = MetricsScraper(Datastore(policy))
    endpoint = Endpoint(
        EndpointMetadata("127.0.0.1:1", "p"),
        metrics=metrics,
        load=EndpointLoad(InFlight(in_flight)),
    )
    endpoint.load.dispatched = dispatched
    assert scraper.accounted(endpoint) is accounted


async def test_a_busy_endpoint_nothing_reads_waits_for_a_read(
    switchable_server: tuple[int, dict[str, float]],
) -> None:
    from epp.scheduling.saturation import SaturationDetector

    port, state = switchable_server
    state["running"] = 3
    scraper = one_endpoint_scraper(port, idle_interval=0.4)
    (endpoint,) = scraper.datastore.endpoints("p")
    await scraper.start()
    try:
        await asyncio.sleep(0.1)
        state["scrapes"] = 0
        await asyncio.sleep(1.0)
        assert 1 <= state["scrapes"] <= 4  # no pick read them: every 0.4 s, not 50 times
        assert endpoint.metrics.running == 3 and endpoint.metrics_grace == 0.4
        detector = SaturationDetector()  # aged metrics of an unread endpoint are not stale
        assert detector.unsaturated([endpoint], endpoint.metrics.scraped_at + 0.5) == [endpoint]

        state["running"] = 5
        read_at = asyncio.get_running_loop().time()
        scraper.metrics_read()
        await until_running(endpoint, 5)
        assert asyncio.get_running_loop().time() - read_at < 0.15  # at the read, not 0.4 s on
        await asyncio.sleep(0.03)
        assert endpoint.metrics_grace == 0.4  # and nothing has read them since
    finally:
        await scraper.stop()


async def test_idle_interval_zero_polls_at_the_busy_interval(
    switchable_server: tuple[int, dict[str, float]],
) -> None:
    port, state = switchable_server
    scraper = one_endpoint_scraper(port, idle_interval=0)
    await scraper.start()
    try:
        await asyncio.sleep(0.5)
    finally:
        await scraper.stop()
    assert state["scrapes"] >= 10


FULL = (
    'vllm:num_requests_running{model_name="m"} 3.0\n'
    'vllm:num_requests_waiting{model_name="m"} 1.0\n'
    'vllm:cache_config_info{block_size="16",num_gpu_blocks="560"} 1.0\n'
    'vllm:e2e_request_latency_seconds_count{model_name="m"} 9.0\n'
)


@pytest.mark.parametrize(
    ("server", "later_paths"),
    [
        ("filters", "filtered"),  # prometheus_client's exposition: only the series asked for
        ("ignores", "filtered"),  # answers everything: parses the same, nothing to change
        ("drops", "whole"),  # a filter that loses what it serves (nameless collectors)
        ("refuses", "whole"),  # a 400 for the query
    ],
)
async def test_scrapes_ask_for_the_series_the_picker_reads(server: str, later_paths: str) -> None:
    queries: list[list[str]] = []

    async def metrics(request: web.Request) -> web.Response:
        names = request.query.getall("name[]", [])
        queries.append(names)
        if not names or server == "ignores":
            return web.Response(text=FULL)
        if server == "refuses":
            return web.Response(status=400, text="no queries here")
        wanted = set(names) if server == "filters" else set()
        lines = [line for line in FULL.splitlines(True) if line.split("{")[0] in wanted]
        return web.Response(text="".join(lines))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with serving(app) as port:
        policy = load_policy_text(
            f"pools: {{p: {{endpoints: [127.0.0.1:{port}]}}}}\nroutes: [{{model: m, pool: p}}]\n"
        )
        datastore = Datastore(policy)
        scraper = MetricsScraper(datastore)
        await scraper.start()
        try:
            (endpoint,) = datastore.endpoints("p")
            for _ in range(3):
                assert await scraper.scrape_once(endpoint)
        finally:
            await scraper.stop()
    m = endpoint.metrics
    assert (m.running, m.waiting, m.block_size, m.num_gpu_blocks) == (3, 1, 16, 560)
    assert scraper.errors == 0
    picked = set(VLLM.series())
    assert picked >= {"vllm:num_requests_running", "vllm:cache_config_info"}
    assert set(queries[0]) == picked  # the first scrape asks for the series
    later = queries[-2:]
    assert later == ([queries[0]] * 2 if later_paths == "filtered" else [[], []]), queries


async def test_an_answer_the_same_as_the_last_is_not_parsed_again_but_counts_as_fresh(
    switchable_server: tuple[int, dict[str, float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import epp.datalayer.scraper

    parsed: list[str] = []

    def counting_parse(text: str, names: MetricNames = VLLM) -> EndpointMetrics:
        parsed.append(text)
        return parse_metrics(text, names)

    monkeypatch.setattr(epp.datalayer.scraper, "parse_metrics", counting_parse)
    port, state = switchable_server
    scraper = one_endpoint_scraper(port, idle_interval=0)
    (endpoint,) = scraper.datastore.endpoints("p")
    await scraper.start()
    try:
        await asyncio.sleep(0.3)
        before = endpoint.metrics
        scraped_at = before.scraped_at
        await asyncio.sleep(0.1)
        assert endpoint.metrics.scraped_at > scraped_at  # fresher, though nothing changed
        assert before.scraped_at == scraped_at  # a snapshot handed out is never changed
        assert state["scrapes"] >= 10 and len(parsed) == 1  # an idle answer: parsed once
        state["running"] = 2
        await until_running(endpoint, 2)
        assert len(parsed) == 2  # a changed answer is parsed
    finally:
        await scraper.stop()


async def test_a_sibling_workers_scrapes_stand_for_this_pickers_own(
    switchable_server: tuple[int, dict[str, float]],
) -> None:
    port, state = switchable_server
    scraper = one_endpoint_scraper(port, idle_interval=0)  # every 20 ms
    (endpoint,) = scraper.datastore.endpoints("p")
    await scraper.start()
    try:
        await asyncio.sleep(0.1)
        state["scrapes"] = 0
        for _ in range(40):  # a sibling scrapes every 10 ms and sends what it read
            scraper.adopt(endpoint, EndpointMetrics(running=7, scraped_at=time.monotonic()))
            await asyncio.sleep(0.01)
        assert state["scrapes"] <= 2 and endpoint.metrics.running == 7
        assert scraper.adopted_rests >= 10
        state["scrapes"] = 0
        await asyncio.sleep(0.3)  # the sibling is gone: this picker scrapes again
        assert state["scrapes"] >= 5 and endpoint.metrics.running == 0
    finally:
        await scraper.stop()
