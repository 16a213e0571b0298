"""Simulated LoRA: dynamic load/unload, selection by model name, residency in the metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import openai

from tests.fakes import close_after_test
from tests.integration.metrics_util import scrape


def newest_lora_info(url: str) -> dict[str, str]:
    series = scrape(url)["vllm:lora_requests_info"]
    return dict(max(series, key=lambda s: s.value).labels)


async def test_lora_lifecycle_and_residency(start_backend: Callable[..., str]) -> None:
    url = start_backend("--cost", "0.005,0,0,0", "--max-loras", "1")
    api = close_after_test(openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0))
    async with aiohttp.ClientSession() as session:
        load = {"lora_name": "sql", "lora_path": "/adapters/sql"}
        async with session.post(f"{url}/v1/load_lora_adapter", json=load) as response:
            assert response.status == 200
            assert "added successfully" in await response.text()
        async with session.post(f"{url}/v1/load_lora_adapter", json=load) as response:
            assert response.status == 400
        assert [m.id for m in api.models.list().data] == ["kvgate-sim", "sql"]
        assert newest_lora_info(url) == {
            "max_lora": "1",
            "running_lora_adapters": "",
            "waiting_lora_adapters": "",
        }
        body = {"model": "sql", "prompt": "select", "max_tokens": 2000, "stream": True}
        response = await session.post(f"{url}/v1/completions", json=body)
        await response.content.readline()
        assert newest_lora_info(url)["running_lora_adapters"] == "sql"
        # a second adapter must wait for the single slot
        await _load(session, url, "chat")
        # headers come with the first token, so wait for the queued request in a task
        second = asyncio.create_task(
            session.post(f"{url}/v1/completions", json={**body, "model": "chat", "max_tokens": 2})
        )
        await asyncio.sleep(0.2)
        info = newest_lora_info(url)
        assert info["running_lora_adapters"] == "sql" and info["waiting_lora_adapters"] == "chat"
        response.close()
        queued = await second
        assert queued.status == 200
        await queued.read()
        queued.close()
        async with session.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "sql"}) as r:
            assert r.status == 200
    try:
        api.completions.create(model="sql", prompt="x", max_tokens=1)
    except openai.NotFoundError:
        pass
    else:
        raise AssertionError("an unloaded adapter must be unknown")


async def _load(session: aiohttp.ClientSession, url: str, name: str) -> None:
    body = {"lora_name": name, "lora_path": f"/adapters/{name}"}
    async with session.post(f"{url}/v1/load_lora_adapter", json=body) as response:
        assert response.status == 200


def test_adapter_name_separates_prefix_cache(start_backend: Callable[..., str]) -> None:
    url = start_backend("--lora-modules", "sql=/adapters/sql", "--cost", "zero")
    api = close_after_test(openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0))
    prompt = "shared prefix " * 10
    api.completions.create(model="kvgate-sim", prompt=prompt, max_tokens=1)
    other = api.completions.create(model="sql", prompt=prompt, max_tokens=1)
    same = api.completions.create(model="sql", prompt=prompt, max_tokens=1)
    assert other.usage is not None and same.usage is not None
    assert other.usage.prompt_tokens_details is not None
    assert other.usage.prompt_tokens_details.cached_tokens == 0
    assert same.usage.prompt_tokens_details is not None
    assert (same.usage.prompt_tokens_details.cached_tokens or 0) > 0


async def test_an_idle_engine_leaves_its_adapter_stamp_alone(
    start_backend: Callable[..., str],
) -> None:
    """As vLLM stamps ``lora_requests_info`` at engine steps only, so that an idle server's
    metrics read the same from scrape to scrape."""
    url = start_backend("--cost", "0.005,0,0,0", "--max-loras", "1")
    async with aiohttp.ClientSession() as session:
        await _load(session, url, "sql")
        idle = [newest_lora_info_stamp(url) for _ in range(2)]
        assert idle[0] == idle[1]
        body = {"model": "sql", "prompt": "select", "max_tokens": 2000, "stream": True}
        response = await session.post(f"{url}/v1/completions", json=body)
        await response.content.readline()
        busy = [newest_lora_info_stamp(url) for _ in range(2)]
        response.close()
    assert idle[1] < busy[0] < busy[1]  # while it works, every scrape sees a new stamp


def newest_lora_info_stamp(url: str) -> float:
    return max(s.value for s in scrape(url)["vllm:lora_requests_info"])
