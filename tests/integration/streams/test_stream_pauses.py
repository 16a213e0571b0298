"""A batch stream paused for an interactive request: real gateway, simulated backends, a pool
with room for one request. The interactive request is served while the batch stream waits; the
batch stream then goes on, in the same response, and its joined answer equals an unpaused one
token for token (the simulated runner's tokens depend on the seed and position only)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable

import aiohttp

from loadtest.harness.processes import KvgateProcess
from tests.integration.metrics_util import scrape

SLOW = ("--cost", "0.02,0,0,0")  # 20 ms a step
KEYS = {"sk-batch": ("b", "batch"), "sk-inter": ("i", "interactive"), "sk-std": ("s", "standard")}
CHAT = "/v1/chat/completions"


def _policy(backends: list[str], batch_pauses: int = 2) -> str:
    keys = "\n".join(
        f"    - {{sha256: {hashlib.sha256(k.encode()).hexdigest()}, tenant: {t}, class: {c}}}"
        for k, (t, c) in KEYS.items()
    )
    return f"""
pools: {{p: {{endpoints: [{", ".join(backends)}], max_concurrency: 1}}}}
routes: [{{model: kvgate-sim, pool: p}}]
classes:
  interactive: {{weight: 6, max_wait: 60s}}
  standard: {{weight: 3, max_wait: 60s, max_pauses: 0}}
  batch: {{weight: 1, max_wait: 60s, max_pauses: {batch_pauses}}}
auth:
  api_keys:
{keys}
"""


def _body(max_tokens: int, stream: bool) -> dict[str, object]:
    return {
        "model": "kvgate-sim",
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": max_tokens,
        "seed": 7,
        "ignore_eos": True,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }


async def _stream(
    session: aiohttp.ClientSession, url: str, key: str, started: asyncio.Event | None = None
) -> list[str]:
    events: list[str] = []
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(url + CHAT, json=_body(60, True), headers=headers) as response:
        assert response.status == 200, await response.text()
        async for line in response.content:
            text = line.decode().strip()
            if text.startswith("data:"):
                events.append(text[5:].strip())
                if started is not None and len(events) == 5:
                    started.set()
    return events


async def _answer(session: aiohttp.ClientSession, url: str, key: str) -> tuple[int, float]:
    began = time.perf_counter()
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(url + CHAT, json=_body(3, False), headers=headers) as response:
        await response.read()
        return response.status, time.perf_counter() - began


def _text(events: list[str]) -> str:
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    return "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])


def _pauses(url: str, outcome: str) -> float:
    samples = scrape(url).get("kvgate_stream_pauses_total", [])
    return sum(s.value for s in samples if s.labels.get("outcome") == outcome)


async def test_a_batch_stream_pauses_for_an_interactive_request_and_goes_on_whole(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backends = [start_backend(*SLOW).removeprefix("http://") for _ in range(2)]
    url, _ = start_gateway(_policy(backends))
    async with aiohttp.ClientSession() as session:
        unpaused = await _stream(session, "http://" + backends[0], "-")
        started = asyncio.Event()
        batch = asyncio.create_task(_stream(session, url, "sk-batch", started))
        await started.wait()
        status, took = await _answer(session, url, "sk-inter")
        assert not batch.done()  # the interactive answer did not wait for the batch stream
        got = await batch
    assert status == 200 and took < 0.6  # 3 tokens, where the stream had ~50 more to go
    assert got[-1] == "[DONE]" and not any('"error"' in e for e in got)
    assert _text(got) == _text(unpaused) and len(_text(got)) == 60
    chunks = [json.loads(e) for e in got[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    usages = [c["usage"] for c in chunks if c.get("usage")]
    assert len(usages) == 1 and usages[0]["completion_tokens"] == 60
    assert _pauses(url, "resumed") == 1


async def test_a_class_marked_not_pausable_and_a_whole_answer_are_never_paused(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backends = [start_backend(*SLOW).removeprefix("http://")]
    url, _ = start_gateway(_policy(backends, batch_pauses=0))
    async with aiohttp.ClientSession() as session:
        for key in ("sk-std", "sk-batch"):  # standard: max_pauses 0; batch here too
            started = asyncio.Event()
            running = asyncio.create_task(_stream(session, url, key, started))
            await started.wait()
            status, _took = await _answer(session, url, "sk-inter")
            assert status == 200 and running.done()  # it waited for the stream's end
            assert (await running)[-1] == "[DONE]"
    assert _pauses(url, "resumed") == 0


async def test_a_client_that_leaves_while_paused_frees_everything(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backends = [start_backend(*SLOW).removeprefix("http://")]
    url, _ = start_gateway(_policy(backends))
    async with aiohttp.ClientSession() as session:
        started = asyncio.Event()
        batch = asyncio.create_task(_stream(session, url, "sk-batch", started))
        await started.wait()
        inter = asyncio.create_task(_stream(session, url, "sk-inter"))
        await asyncio.sleep(0.3)  # the batch stream is paused, the interactive one runs
        batch.cancel()
        assert (await inter)[-1] == "[DONE]"
        for _ in range(2):  # its slot came back: the pool serves on, one at a time
            status, _took = await _answer(session, url, "sk-batch")
            assert status == 200
    samples = scrape(url)
    assert sum(s.value for s in samples["kvgate_queue_depth"]) == 0
