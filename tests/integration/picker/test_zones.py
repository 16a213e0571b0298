"""Zone preference through a real gateway: two zones of simulated backends; the picker's own
zone serves while it has room, and a saturating burst spills to the other zone, each such
pick counted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import aiohttp
import pytest

from loadtest.harness.processes import KvgateProcess, backend_process, free_port
from tests.integration.metrics_util import scrape


@pytest.fixture
def zones() -> Iterator[dict[str, list[str]]]:
    """Two backends in zone b, listed first (where ties go), two in zone a: 20 ms a step, two
    sequences at a time."""
    with ExitStack() as stack:
        placed: dict[str, list[str]] = {"b": [], "a": []}
        for zone in ("b", "b", "a", "a"):
            port = free_port()
            stack.enter_context(
                backend_process(port, "--cost", "0.02,0,0,0", "--max-num-seqs", "2")
            )
            placed[zone].append(f"127.0.0.1:{port}")
        yield placed


def policy(zones: dict[str, list[str]]) -> str:
    endpoints = ", ".join(
        f"{{address: {address}, labels: {{zone: {zone}}}}}"
        for zone, addresses in zones.items()
        for address in addresses
    )
    return f"""
pools: {{p: {{endpoints: [{endpoints}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
observability: {{access_log: "off"}}
epp:
  zone: a
  plugins:
    - {{name: zone, type: zone-affinity-scorer}}
    - {{name: active, type: active-request-scorer}}
    - {{name: pick, type: max-score-picker}}
  profiles: [{{name: default, plugins: [{{ref: zone, weight: 4}}, {{ref: active}}, {{ref: pick}}]}}]
"""


def served(addresses: list[str]) -> float:
    """Requests the backends finished (a backend that served none has no series yet)."""
    samples = [scrape(f"http://{a}").get("vllm:request_success_total", []) for a in addresses]
    return sum(s.value for series in samples for s in series)


def cross_zone(url: str) -> float:
    return sum(s.value for s in scrape(url).get("kvgate_epp_cross_zone_picks_total", []))


async def complete(session: aiohttp.ClientSession, url: str, max_tokens: int) -> None:
    body = {"model": "kvgate-sim", "prompt": "where am I", "max_tokens": max_tokens}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        await response.read()


async def test_the_own_zone_serves_until_full_then_the_other_takes_the_rest(
    zones: dict[str, list[str]], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    url, _ = start_gateway(policy(zones))
    async with aiohttp.ClientSession() as session:
        for _ in range(8):
            await complete(session, url, 2)
        assert (served(zones["a"]), served(zones["b"]), cross_zone(url)) == (8, 0, 0)
        await asyncio.gather(*(complete(session, url, 16) for _ in range(48)))
    spilled = served(zones["b"])
    assert spilled > 0 and served(zones["a"]) - 8 > spilled, (served(zones["a"]), spilled)
    assert cross_zone(url) >= spilled
