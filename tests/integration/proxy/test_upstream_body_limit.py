"""An upstream body the gateway reads whole (a JSON answer) that runs past the gateway's limit
fails the request with a 502 that says why, instead of filling the gateway's memory."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import aiohttp
from aiohttp import web

from kvgate.wire.http.client import MAX_UPSTREAM_BODY
from loadtest.harness.processes import KvgateProcess
from tests.http_servers import serving, streaming_app
from tests.integration.gateway_stack import one_upstream_policy
from tests.integration.metrics_util import scrape

MIB = 1 << 20


SIZE = MAX_UPSTREAM_BODY + 16 * MIB  # a JSON answer 16 MiB over the gateway's limit


def huge_json() -> Iterator[bytes]:
    """The answer, 1 MiB at a time."""
    yield b'{"choices": [], "pad": "'
    sent = 24
    while sent < SIZE - 2:
        part = b"x" * min(MIB, SIZE - 2 - sent)
        yield part
        sent += len(part)
    yield b'"}'


def huge_json_app() -> web.Application:
    headers = {"Content-Type": "application/json", "Content-Length": str(SIZE)}
    return streaming_app(huge_json, headers=headers)


async def test_a_body_over_the_limit_is_a_502_that_says_why(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    async with serving(huge_json_app(), shutdown_timeout=0.1) as port:
        url, _ = start_gateway(one_upstream_policy(port))
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
            session.post(f"{url}/v1/completions", json={"model": "m", "prompt": "x"}) as response,
        ):
            assert response.status == 502
            error = (await response.json())["error"]
        assert "response body over 256 MiB" in error["message"]
        assert error["code"] == "upstream_error"


async def test_a_shadow_answer_over_the_limit_counts_as_a_failed_copy(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    primary = start_backend("--cost", "zero").removeprefix("http://")
    async with serving(huge_json_app(), shutdown_timeout=0.1) as port:
        url, _ = start_gateway(
            f"""
pools:
  main: {{model: kvgate-sim, endpoints: [{primary}]}}
  shadow: {{endpoints: [127.0.0.1:{port}]}}
routes: [{{model: kvgate-sim, pool: main, shadow: {{pool: shadow, sample: 1.0, compare: [status]}}}}]
epp: {{picker: least-in-flight}}
"""
        )
        body = {"model": "kvgate-sim", "prompt": "x", "max_tokens": 1}
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/v1/completions", json=body) as response,
        ):
            assert response.status == 200
        for _ in range(100):
            results = {
                s.labels["result"]: s.value
                for s in scrape(url).get("kvgate_shadow_results_total", [])
            }
            if results:
                break
            await asyncio.sleep(0.1)
        assert results == {"error": 1.0}
