"""Canary, A/B, shadow and fallback through a real gateway and real backends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from loadtest.harness.processes import KvgateProcess, free_port
from tests.integration.metrics_util import scrape, value


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, object],
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], float]:  # fmt: skip
    started = time.perf_counter()
    async with session.post(f"{url}/v1/completions", json=body, headers=headers or {}) as response:
        await response.read()
        return response.status, dict(response.headers), time.perf_counter() - started


def served(backend: str) -> float:
    return sum(s.value for s in scrape(backend)["vllm:request_success_total"])


async def test_canary_and_ab_routes(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    a, b = start_backend("--cost", "zero"), start_backend("--cost", "zero")
    url, _ = start_gateway(f"""
pools: {{a: {{model: kvgate-sim, endpoints: [{a.removeprefix("http://")}]}},
        b: {{model: kvgate-sim, endpoints: [{b.removeprefix("http://")}]}}}}
routes:
  - {{model: kvgate-sim, canary: [{{pool: a, weight: 80}}, {{pool: b, weight: 20}}]}}
  - model: exp-model
    ab_test: {{name: exp, key: user, arms: [{{name: old, pool: a, weight: 5000}}, {{name: new, pool: b, weight: 5000}}]}}
observability: {{access_log: "off"}}
""")
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            await post(session, url, {"model": "kvgate-sim", "prompt": "c", "max_tokens": 1})
        assert 0.1 <= served(b) / 200 <= 0.3  # 20% ± noise over 200 requests
        arms = set()
        for user in ("alice", "bob", "carol", "dave", "erin", "frank"):
            seen = set()
            for _ in range(3):
                status, headers, _ = await post(
                    session,
                    url,
                    {"model": "exp-model", "prompt": "x", "max_tokens": 1, "user": user},
                )
                assert status == 200
                seen.add(headers["x-kvgate-ab-arm"])
            assert len(seen) == 1  # sticky
            arms |= seen
    assert arms <= {"exp=old", "exp=new"}
    counts = {s.labels["arm"]: s.value for s in scrape(url)["kvgate_ab_requests_total"]}
    assert sum(counts.values()) == 18


async def test_shadow_never_touches_the_primary(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    primary = start_backend("--cost", "zero")
    slow_shadow = start_backend("--cost", "0.1,0,0,0")  # 100 ms per step
    url, _ = start_gateway(f"""
pools:
  main: {{model: kvgate-sim, endpoints: [{primary.removeprefix("http://")}]}}
  shadow: {{model: kvgate-sim, endpoints: [{slow_shadow.removeprefix("http://")}]}}
  dead: {{endpoints: [127.0.0.1:{free_port()}]}}
routes:
  - {{model: kvgate-sim, pool: main, shadow: {{pool: shadow, sample: 1.0, compare: [status, tokens, text, latency], max_in_flight: 64}}}}
  - {{model: broken-shadow, pool: main, shadow: {{pool: dead, sample: 1.0}}}}
epp: {{picker: least-in-flight}}
""")
    async with aiohttp.ClientSession() as session:
        latencies = []
        for i in range(10):
            status, _, latency = await post(
                session, url, {"model": "kvgate-sim", "prompt": f"s{i}", "max_tokens": 4}
            )
            assert status == 200
            latencies.append(latency)
        for _ in range(3):
            status, _, _ = await post(
                session, url, {"model": "broken-shadow", "prompt": "x", "max_tokens": 1}
            )
            assert status == 200
    assert max(latencies) < 0.38  # a shadow takes > 0.4 s: the client never waited for one
    await asyncio.sleep(1.5)
    results = {
        (s.labels["route"], s.labels["result"]): s.value
        for s in scrape(url)["kvgate_shadow_results_total"]
    }
    assert results.get(("kvgate-sim", "match")) == 10  # same deterministic tokens and text
    assert results.get(("broken-shadow", "error")) == 3
    assert value(slow_shadow, "vllm:generation_tokens_total") == 40


async def test_fallback_model_when_the_pool_is_down(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    live = start_backend("--cost", "zero").removeprefix("http://")
    url, _ = start_gateway(f"""
pools: {{down: {{endpoints: [127.0.0.1:{free_port()}]}}, up: {{model: kvgate-sim, endpoints: [{live}]}}}}
routes:
  - {{model: kvgate-sim, pool: down, fallback: [backup]}}
  - {{model: backup, pool: up}}
""")
    async with aiohttp.ClientSession() as session:
        for _ in range(5):
            status, _, _ = await post(
                session, url, {"model": "kvgate-sim", "prompt": "f", "max_tokens": 1}
            )
            assert status == 200
    fallbacks = scrape(url)["kvgate_fallbacks_total"]
    assert sum(s.value for s in fallbacks) == 5
