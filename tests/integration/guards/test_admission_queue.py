"""The admission queue through a real gateway: a saturated pool serves three priority classes
in proportion to their weights, and two tenants of one class equally."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from collections.abc import Callable

import aiohttp

from loadtest.harness.processes import KvgateProcess

KEYS = {f"sk-{name}": name for name in ("inter", "std", "batch", "std2")}


def key_entry(key: str, tenant: str, cls: str) -> str:
    return f"{{sha256: {hashlib.sha256(key.encode()).hexdigest()}, tenant: {tenant}, class: {cls}}}"


async def test_saturated_pool_serves_classes_by_weight_and_tenants_equally(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backend = start_backend("--cost", "0.01,0,0,0").removeprefix("http://")
    url, _ = start_gateway(f"""
pools: {{p: {{endpoints: [{backend}], max_concurrency: 2}}}}
routes: [{{model: kvgate-sim, pool: p}}]
epp: {{picker: least-in-flight}}
observability: {{access_log: "off"}}
classes:
  interactive: {{weight: 6, max_queue: 1000, max_wait: 60s}}
  standard: {{weight: 3, max_queue: 1000, max_wait: 60s}}
  batch: {{weight: 1, max_queue: 1000, max_wait: 60s}}
auth:
  api_keys:
    - {key_entry("sk-inter", "a", "interactive")}
    - {key_entry("sk-std", "b", "standard")}
    - {key_entry("sk-std2", "c", "standard")}
    - {key_entry("sk-batch", "d", "batch")}
""")
    finished: list[tuple[float, str]] = []
    body = {"model": "kvgate-sim", "prompt": "x", "max_tokens": 2}

    async def one(session: aiohttp.ClientSession, key: str) -> None:
        async with session.post(
            f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            await response.read()
            assert response.status == 200
        finished.append((time.perf_counter(), key))

    plan = ["sk-inter"] * 150 + ["sk-std"] * 50 + ["sk-std2"] * 500 + ["sk-batch"] * 150
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=120)
    ) as session:
        tasks = [asyncio.create_task(one(session, key)) for key in plan]
        await asyncio.sleep(3)  # about 150 requests served; every class still backlogged
        snapshot = [key for _, key in sorted(finished)][4:]  # skip the first, pre-queue ones
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    counts = Counter(snapshot)
    total = len(snapshot)
    assert total >= 60, counts
    classes = {
        "interactive": counts["sk-inter"],
        "standard": counts["sk-std"] + counts["sk-std2"],
        "batch": counts["sk-batch"],
    }
    for cls, share in (("interactive", 0.6), ("standard", 0.3), ("batch", 0.1)):
        assert abs(classes[cls] / total - share) <= 0.05, (classes, total)
    assert abs(counts["sk-std"] - counts["sk-std2"]) <= 2, counts  # 10x more sent, equal share
