"""Spend and budgets through real gateways: what ``kvgate_spend_total`` counts is what the
engine's own token counts cost; a tenant's budget, shared by two replicas through a real
Redis, holds within 1% of its limit; a spent budget is OpenAI's ``insufficient_quota`` to
the official client; ``kvgate spend report`` reads the month from a real Prometheus."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import openai
import pytest

from loadtest.harness.processes import KvgateProcess, free_port
from loadtest.harness.redis_server import RedisServer
from tests.integration.metrics_util import scrape
from tests.integration.prometheus_server import PrometheusServer

KEY = "sk-spend-acme"
INPUT, CACHED, OUTPUT = 1.0, 0.25, 4.0  # per million tokens
LIMIT = 0.04  # USD a day: about 350 requests, each reserving at most 0.6% of it

Start = Callable[..., tuple[str, KvgateProcess]]


def policy(backend: str, redis_url: str, limit: float = LIMIT) -> str:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    return f"""
auth: {{api_keys: [{{sha256: {digest}, tenant: acme, name: acme-key}}]}}
pools: {{p: {{endpoints: [{backend}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
epp: {{picker: least-in-flight}}
limits: {{store: {{kind: redis, url: "{redis_url}", timeout: 200ms}}, chars_per_token: 1}}
spend:
  prices: {{kvgate-sim: {{input: {INPUT}, cached_input: {CACHED}, output: {OUTPUT}}}}}
  budgets: [{{tenant: acme, per: day, limit: {limit}}}]
"""


def engine_cost(backend: str) -> float:
    """What the engine's own counts of prompt, cached and generated tokens cost."""
    samples = scrape(backend)

    def total(name: str) -> float:
        return sum(s.value for s in samples.get(name, []))

    prompt, cached = total("vllm:prompt_tokens_total"), total("vllm:prefix_cache_hits_total")
    generated = total("vllm:generation_tokens_total")
    return ((prompt - cached) * INPUT + cached * CACHED + generated * OUTPUT) / 1e6


def counted(url: str) -> float:
    return sum(s.value for s in scrape(url).get("kvgate_spend_total", []))


@pytest.fixture
def backend(start_backend: Callable[..., str]) -> str:
    return start_backend("--cost", "zero")


async def complete(session: aiohttp.ClientSession, url: str, number: int) -> int:
    body = {
        "model": "kvgate-sim",
        "prompt": f"{number % 5} spent on a shared prefix that the engine caches " * 3,
        "max_tokens": 16,
        "temperature": 0.8,
        **({"stream": True} if number % 2 else {}),
    }
    headers = {"authorization": f"Bearer {KEY}"}
    async with session.post(f"{url}/v1/completions", json=body, headers=headers) as response:
        await response.read()
        return response.status


async def spend_until_refused(urls: list[str]) -> int:
    """Requests 8 at a time over the replicas until a whole round is refused even after the
    refunds of the answers before it settled; the number answered."""
    answered, number, refused = 0, 0, 0
    async with aiohttp.ClientSession() as session:
        while refused < 2:
            batch = range(number, number + 8)
            statuses = await asyncio.gather(
                *(complete(session, urls[n % len(urls)], n) for n in batch)
            )
            number += 8
            answered += statuses.count(200)
            assert set(statuses) <= {200, 429}, statuses
            refused = 0 if 200 in statuses else refused + 1
            if refused:
                await asyncio.sleep(0.5)  # the replicas send what they owe every 0.1 s
    return answered


@pytest.fixture
def two_replicas(redis_server: RedisServer, backend: str, start_gateway: Start) -> list[str]:
    text = policy(backend.removeprefix("http://"), redis_server.url)
    return [start_gateway(text)[0] for _ in range(2)]


async def test_a_shared_budget_holds_and_spend_is_what_the_engine_counted(
    two_replicas: list[str], backend: str
) -> None:
    answered = await spend_until_refused(two_replicas)
    spent = engine_cost(backend)
    assert answered > 300
    assert LIMIT * 0.99 <= spent <= LIMIT * 1.01, spent
    assert sum(counted(url) for url in two_replicas) == pytest.approx(spent, rel=1e-3)


async def test_a_spent_budget_is_insufficient_quota_to_the_official_client(
    redis_server: RedisServer, backend: str, start_gateway: Start
) -> None:
    url, _ = start_gateway(policy(backend.removeprefix("http://"), redis_server.url, 0.0002))
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    first = await client.completions.with_raw_response.create(
        model="kvgate-sim", prompt="short", max_tokens=8
    )
    left = float(first.headers["x-kvgate-spend-remaining"])
    assert 0 < left < 0.0002
    with pytest.raises(openai.RateLimitError) as refused:
        for _ in range(20):
            await client.completions.create(model="kvgate-sim", prompt="short", max_tokens=40)
    await client.close()
    error = refused.value
    assert error.code == "insufficient_quota"
    assert error.response.headers["x-should-retry"] == "false"
    assert "daily budget" in error.message and "renews at" in error.message


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[PrometheusServer]:
    server = PrometheusServer(tmp_path, free_port())
    yield server
    server.stop()


async def test_the_monthly_report_is_what_the_gateways_counted(
    two_replicas: list[str], prometheus: PrometheusServer
) -> None:
    targets = [url.removeprefix("http://") for url in two_replicas]
    prometheus.start(
        {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "kvgate", "static_configs": [{"targets": targets}]}],
        }
    )
    async with aiohttp.ClientSession() as session:
        for number in range(20):
            assert await complete(session, two_replicas[number % 2], number) == 200
    expected = sum(counted(url) for url in two_replicas)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until Prometheus has scraped the last counts
        found = prometheus.api("query", query="sum(kvgate_spend_total)")["result"]
        if found and float(found[0]["value"][1]) == pytest.approx(expected, rel=1e-9):
            break
        await asyncio.sleep(0.5)
    month = datetime.now(UTC).strftime("%Y-%m")
    argv = [sys.executable, "-m", "kvgate", "spend", "report", "--month", month, "--csv"]
    report = await asyncio.to_thread(
        subprocess.run,
        [*argv, "--prometheus", prometheus.url],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = report.stdout.strip().splitlines()
    assert lines[0] == "tenant,model,spend_usd"
    assert lines[1].startswith("acme,kvgate-sim,")
    assert float(lines[1].split(",")[2]) == pytest.approx(expected, rel=1e-6)
