"""What the access log records of a request: the facts of the pool that served it, not of
the pools that could not."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.lifecycle import running
from loadtest.harness.processes import free_port
from policies.loader import load_policy_text
from tests.http_servers import serving


@pytest.fixture
async def answering_upstream() -> AsyncIterator[int]:
    async def complete(request: web.Request) -> web.Response:
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return web.json_response({"choices": [{"text": "ok"}], "usage": usage})

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    async with serving(app) as port:
        yield port


async def test_a_request_a_fallback_served_is_logged_without_the_first_pools_error(
    answering_upstream: int, caplog: pytest.LogCaptureFixture
) -> None:
    dead = free_port()  # nothing listens: the first pool's only endpoint refuses
    policy = load_policy_text(f"""
pools: {{down: {{endpoints: [127.0.0.1:{dead}]}}, up: {{endpoints: [127.0.0.1:{answering_upstream}]}}}}
routes:
  - {{model: m, pool: down, fallback: [backup]}}
  - {{model: backup, pool: up}}
retries: {{attempts: 1, backoff: 1ms, max_backoff: 1ms}}
""")
    caplog.set_level(logging.INFO, logger="kvgate.access")
    async with (
        running(create_app(policy), "127.0.0.1", 0) as server,
        aiohttp.ClientSession() as client,
        client.post(
            f"http://127.0.0.1:{server.port}/v1/completions", json={"model": "m", "prompt": "x"}
        ) as response,
    ):
        assert response.status == 200
    records = [json.loads(r.getMessage()) for r in caplog.records if r.name == "kvgate.access"]
    assert len(records) == 1
    record = records[0]
    assert (record["status"], record["error"]) == (200, None)
    assert (record["pool"], record["endpoint"]) == ("up", f"127.0.0.1:{answering_upstream}")
    assert record["attempts"] == 1  # of the pool that served it
