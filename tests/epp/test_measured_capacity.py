"""Capacities measured from the engines' decode speed (a pool's ``capacity: measured``): the
inter-token latency histogram read from the scrape, carried between workers, turned into each
endpoint's speed per running request and a capacity relative to the pool's mean."""

from __future__ import annotations

import msgpack
import pytest

from epp.datalayer.datastore import Datastore
from epp.datalayer.measured_capacity import DecodeSpeeds
from epp.datalayer.metrics_parser import SGLANG, VLLM, parse_metrics
from epp.datalayer.scraper import MetricsScraper
from epp.framework import Endpoint, EndpointMetadata, EndpointMetrics
from epp.requestcontrol.pick_exchange import decode_metrics, encode_metrics
from policies.errors import PolicyError
from policies.loader import load_policy_text

POLICY = """pools:
  p: {{capacity: {capacity}, endpoints: [10.0.0.1:8000, 10.0.0.2:8000, 10.0.0.3:8000]}}
routes: [{{model: m, pool: p}}]
"""


def scraped(endpoint: Endpoint, gaps: float, seconds: float) -> None:
    endpoint.metrics = EndpointMetrics(token_gaps=gaps, token_gap_seconds=seconds)


def test_a_three_times_faster_engine_gets_three_times_the_capacity() -> None:
    fast, slow = (
        Endpoint(EndpointMetadata("10.0.0.1:8000", "p")),
        Endpoint(EndpointMetadata("10.0.0.2:8000", "p")),
    )
    pool, speeds = [fast, slow], DecodeSpeeds()
    for scrape in range(6):  # 30 more gaps each time: 60 and 20 tokens/s per request
        for endpoint, rate in ((fast, 60), (slow, 20)):
            scraped(endpoint, scrape * 30.0, scrape * 30.0 / rate)
            speeds.observe(endpoint, pool)
    assert speeds.speeds == {fast.address: pytest.approx(60), slow.address: pytest.approx(20)}
    assert fast.capacity / slow.capacity == pytest.approx(3)
    assert (fast.capacity + slow.capacity) / 2 == pytest.approx(1)


def test_idle_intervals_a_restarted_engine_and_the_unmeasured_say_nothing() -> None:
    busy, idle, new = (Endpoint(EndpointMetadata(f"10.0.0.{n}:8000", "p")) for n in (1, 2, 3))
    pool, speeds = [busy, idle, new], DecodeSpeeds()
    for gaps, seconds in ((1_000.0, 20.0), (1_050.0, 21.0), (10.0, 0.2), (10.0, 0.2)):
        scraped(busy, gaps, seconds)  # 50 tokens/s; then a restart; then nothing made
        speeds.observe(busy, pool)
    for _ in range(3):  # scraped, never decoding anything
        scraped(idle, 0.0, 0.0)
        speeds.observe(idle, pool)
    assert speeds.speeds == {busy.address: pytest.approx(50)}
    assert [e.capacity for e in pool] == [1.0, 1.0, 1.0]


def test_the_speed_is_smoothed_and_the_capacity_bounded() -> None:
    quick, crawl = (
        Endpoint(EndpointMetadata("10.0.0.1:8000", "p")),
        Endpoint(EndpointMetadata("10.0.0.2:8000", "p")),
    )
    pool, speeds = [quick, crawl], DecodeSpeeds()
    for endpoint, totals in (
        (quick, ((0.0, 0.0), (100.0, 1.0), (300.0, 2.0))),  # 100, then 200 tokens/s
        (crawl, ((0.0, 0.0), (1.0, 10.0), (2.0, 20.0))),  # 0.1 tokens/s
    ):
        for gaps, seconds in totals:
            scraped(endpoint, gaps, seconds)
            speeds.observe(endpoint, pool)
    assert speeds.speeds[quick.address] == pytest.approx(100 + 0.3 * (200 - 100))
    assert quick.capacity == pytest.approx(1.998, abs=1e-3) and crawl.capacity == 0.1


def test_the_histogram_is_read_summed_over_engines_and_crosses_to_sibling_workers() -> None:
    name = "vllm:inter_token_latency_seconds"
    text = (
        f'{name}_bucket{{engine="0",le="0.01"}} 700.0\n'
        f'{name}_count{{engine="0",model_name="m"}} 1200.0\n'
        f'{name}_sum{{engine="0",model_name="m"}} 12.5\n'
        f'{name}_count{{engine="1",model_name="m"}} 34.0\n'
        f'{name}_sum{{engine="1",model_name="m"}} 0.5\n'
        "vllm:num_requests_running 2\n"
    )
    metrics = parse_metrics(text)
    assert (metrics.token_gaps, metrics.token_gap_seconds) == (1234.0, 13.0)
    assert {f"{name}_sum", f"{name}_count"} <= set(VLLM.series())
    assert "sglang:inter_token_latency_seconds_count" in SGLANG.series()
    address, carried = decode_metrics(msgpack.unpackb(encode_metrics("h:1", metrics))[1:])
    assert address == "h:1" and carried.running == 2
    assert (carried.token_gaps, carried.token_gap_seconds) == (1234.0, 13.0)


def test_a_pool_measures_only_when_its_policy_says_so() -> None:
    measured = load_policy_text(POLICY.format(capacity="measured"))
    configured = load_policy_text(POLICY.format(capacity="configured"))
    assert measured.pools["p"].measured_capacity and not configured.pools["p"].measured_capacity
    refused = r"pools\.p\.capacity \(line 2\): must be one of configured, measured; got 'fast'"
    with pytest.raises(PolicyError, match=refused):
        load_policy_text(POLICY.format(capacity="fast"))
    speeds = {"measured": [40 / 30, 40 / 30, 10 / 30], "configured": [1.0, 1.0, 1.0]}
    for policy, expect in ((measured, speeds["measured"]), (configured, speeds["configured"])):
        datastore = Datastore(policy)
        scraper = MetricsScraper(datastore)
        endpoints = datastore.endpoints("p")
        for scrape in range(3):  # 40, 40 and 10 tokens/s per running request
            for endpoint, rate in zip(endpoints, (40, 40, 10), strict=True):
                gaps = scrape * 40.0
                metrics = EndpointMetrics(token_gaps=gaps, token_gap_seconds=gaps / rate)
                scraper.adopt(endpoint, metrics)
        assert [e.capacity for e in endpoints] == pytest.approx(expect)
