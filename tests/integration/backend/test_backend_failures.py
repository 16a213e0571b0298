"""Bad input and client disconnects against a real backend process."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable

import aiohttp
import pytest

from tests.integration.metrics_util import value


@pytest.mark.parametrize(
    ("path", "data", "status"),
    [
        ("/v1/completions", b"{not json", 400),
        ("/v1/completions", b"[1, 2]", 400),
        (
            "/v1/completions",
            b'{"model": "kvgate-sim", "prompt": "x", "max_tokens": null, "n": 0}',
            400,
        ),
        ("/v1/chat/completions", b'{"model": "kvgate-sim", "messages": [{"role": 1}]}', 400),
        ("/v1/nowhere", b"{}", 404),
        ("/v1/load_lora_adapter", b'{"lora_name": "a"}', 400),
        ("/v1/unload_lora_adapter", b'{"lora_name": "ghost"}', 404),
    ],
)
async def test_bad_http_requests(backend_url: str, path: str, data: bytes, status: int) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(backend_url + path, data=data) as response:
            assert response.status == status
            body = await response.json()
            assert set(body["error"]) == {"message", "type", "param", "code"}
        # and the server is still healthy
        async with session.get(backend_url + "/health") as response:
            assert response.status == 200


async def test_oversized_body_is_413(backend_url: str) -> None:
    payload = json.dumps({"model": "kvgate-sim", "prompt": "x" * (40 * 1024 * 1024)}).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(backend_url + "/v1/completions", data=io.BytesIO(payload)) as response,
    ):
        assert response.status == 413
        assert "error" in await response.json()


async def test_client_disconnect_aborts_and_frees_blocks(start_backend: Callable[..., str]) -> None:
    url = start_backend("--cost", "0.01,0,0,0")  # 10 ms per step: 2,000 tokens take 20 s
    body = {"model": "kvgate-sim", "prompt": "long " * 50, "max_tokens": 2000, "stream": True}
    async with aiohttp.ClientSession() as session:
        response = await session.post(url + "/v1/completions", json=body)
        assert response.status == 200
        await response.content.readline()
        assert value(url, "vllm:num_requests_running") == 1
        assert value(url, "vllm:kv_cache_usage_perc") > 0
        response.close()
    for _ in range(100):
        if value(url, "vllm:num_requests_running") == 0:
            break
        await asyncio.sleep(0.05)
    assert value(url, "vllm:num_requests_running") == 0
    assert value(url, "vllm:kv_cache_usage_perc") == 0


async def test_non_streaming_disconnect_aborts_too(start_backend: Callable[..., str]) -> None:
    url = start_backend("--cost", "0.01,0,0,0")
    body = {"model": "kvgate-sim", "prompt": "wait", "max_tokens": 2000}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as session:
        with pytest.raises(asyncio.TimeoutError):
            await session.post(url + "/v1/completions", json=body)
    for _ in range(100):
        if value(url, "vllm:num_requests_running") == 0:
            break
        await asyncio.sleep(0.05)
    assert value(url, "vllm:num_requests_running") == 0
