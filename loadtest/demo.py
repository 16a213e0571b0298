"""``kvgate demo``: two simulated backends, a few requests, and what they show.

Later issues grow this into the full demo (gateway, picker, load test); today it shows the
reference backend's prefix cache at work: the same long prompt sent twice is served from cache
the second time (``cached_tokens``, a shorter time to first token, ``vllm:prefix_cache_hits``).
"""

from __future__ import annotations

import asyncio
from contextlib import ExitStack

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from loadtest.processes import backend_process, free_port
from loadtest.sse import stream_request

SYSTEM_PROMPT = (
    "You are a meticulous assistant for a logistics company. Answer in short sentences, cite the "
    "relevant policy section, and never invent shipment numbers. " * 12
)
WATCHED = (
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_requests_running",
    "vllm:generation_tokens",
)


async def scrape(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with session.get(f"{base}/metrics") as response:
        text = await response.text()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name in WATCHED and not sample.name.endswith("_created"):
                values[family.name] = sample.value
    return values


async def run_demo(bases: list[str]) -> None:
    chat = {
        "model": "kvgate-sim",
        "max_tokens": 24,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "Where is my parcel?"},
        ],
    }
    async with aiohttp.ClientSession() as session:
        print(f"backends: {', '.join(bases)}")
        for attempt in ("first", "repeat"):
            result = await stream_request(session, f"{bases[0]}/v1/chat/completions", chat)
            print(
                f"[{bases[0]}] chat ({attempt}): status={result.status} "
                f"prompt_tokens={result.usage.get('prompt_tokens')} "
                f"cached_tokens={result.cached_tokens} ttft={result.ttft * 1000:.1f}ms "
                f"total={result.latency * 1000:.1f}ms text={result.text[:40]!r}"
            )
        completion = {"model": "kvgate-sim", "prompt": "Once upon a time", "max_tokens": 16}
        result = await stream_request(session, f"{bases[1]}/v1/completions", completion)
        print(
            f"[{bases[1]}] completion: status={result.status} chunks={result.chunks} "
            f"ttft={result.ttft * 1000:.1f}ms text={result.text!r}"
        )
        for base in bases:
            values = await scrape(session, base)
            shown = " ".join(f"{k.split(':')[1]}={v:g}" for k, v in sorted(values.items()))
            print(f"[{base}] metrics: {shown}")


def main() -> int:
    ports = [free_port(), free_port()]
    with ExitStack() as stack:
        for port in ports:
            stack.enter_context(backend_process(port))
        asyncio.run(run_demo([f"http://127.0.0.1:{p}" for p in ports]))
    print("demo finished: backends stopped cleanly")
    return 0
