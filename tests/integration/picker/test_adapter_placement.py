"""LoRA adapters the gateway places itself, on real simulated engines behind a real gateway:
a request for an adapter no engine has loaded is served after one load, and a hundred requests
over twenty adapters on four engines with room for four each all succeed, each engine holding
at most four."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import aiohttp

from loadtest.harness.processes import KvgateProcess
from tests.integration.metrics_util import scrape

ENGINE = ("--max-loras", "4", "--cost", "0.002,0.00001,0.00005,0,0.004")


def policy(engines: list[str], adapters: list[str], max_adapters: int) -> str:
    sources = ", ".join(f"{name}: /adapters/{name}" for name in adapters)
    routes = ", ".join(f"{{model: {name}, pool: p}}" for name in adapters)
    return f"""
pools: {{p: {{endpoints: [{", ".join(engines)}], adapters: {{{sources}}},
             max_adapters: {max_adapters}}}}}
routes: [{routes}]
"""


async def loaded_on(session: aiohttp.ClientSession, engine: str) -> set[str]:
    """The adapters an engine serves (its /v1/models, less the base model)."""
    async with session.get(f"http://{engine}/v1/models") as response:
        models = {m["id"] for m in (await response.json())["data"]}
    return models - {"kvgate-sim"}


async def complete(session: aiohttp.ClientSession, url: str, model: str, n: int) -> int:
    body = {"model": model, "prompt": f"{model} question {n}", "max_tokens": 8}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        await response.read()
        return response.status


def changes(url: str) -> dict[str, float]:
    return {
        s.labels["outcome"]: s.value for s in scrape(url).get("kvgate_adapter_changes_total", [])
    }


async def test_the_first_requests_for_an_unloaded_adapter_wait_on_one_load(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    engines = [start_backend(*ENGINE).removeprefix("http://") for _ in range(2)]
    url, _ = start_gateway(policy(engines, ["sql", "chat"], 2))
    async with aiohttp.ClientSession() as session:
        assert [await loaded_on(session, e) for e in engines] == [set(), set()]
        statuses = await asyncio.gather(*(complete(session, url, "sql", n) for n in range(10)))
        assert statuses == [200] * 10
        holding = [e for e in engines if "sql" in await loaded_on(session, e)]
    assert 1 <= len(holding) <= 2
    assert changes(url) == {"loaded": len(holding)}  # one load per engine, not one per request


async def test_a_hundred_requests_over_twenty_adapters_on_four_engines(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    engines = [start_backend(*ENGINE).removeprefix("http://") for _ in range(4)]
    adapters = [f"a{n}" for n in range(20)]
    url, _ = start_gateway(policy(engines, adapters, 4))
    rng = random.Random(7)
    asked = [rng.choice(adapters) for _ in range(100)]
    async with aiohttp.ClientSession() as session:
        statuses: list[int] = []
        for start in range(0, 100, 4):  # four at a time
            wave = asked[start : start + 4]
            statuses += await asyncio.gather(
                *(complete(session, url, model, start + n) for n, model in enumerate(wave))
            )
        held = [await loaded_on(session, e) for e in engines]
    assert statuses == [200] * 100
    assert all(len(adapters_there) <= 4 for adapters_there in held), held
    # as few engines as the load allows: four at a time saturate none, so no adapter is
    # loaded twice (engines hold sixteen of the nineteen asked: some are unloaded and loaded
    # again, 23 loads at best; 30 measured)
    everywhere = [adapter for adapters_there in held for adapter in adapters_there]
    assert len(everywhere) == len(set(everywhere)), held
    counted = changes(url)
    assert counted["loaded"] - counted.get("unloaded", 0) == len(everywhere)
    assert counted["loaded"] <= 40, counted
