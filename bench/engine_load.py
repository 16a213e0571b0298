"""The engine benchmark's client: streamed token-id completions against an OpenAI server.

Each request is ``prompt: [token ids]``, greedy, ``ignore_eos`` and a fixed ``max_tokens``,
so every engine computes exactly the same work; ``cache_salt`` (vLLM's) keeps one round from
hitting another's prefix cache. Output tokens are the server's ``usage.completion_tokens``;
TTFT is the time to the first chunk that carries a choice.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from dataclasses import dataclass, field

import aiohttp

from loadtest.reports.stats import percentile


@dataclass
class LoadRound:
    output_tokens: int = 0
    seconds: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds else 0.0

    @property
    def ttft_p50_ms(self) -> float:
        return percentile(self.ttfts, 50) * 1000 if self.ttfts else float("nan")


def make_prompts(count: int, low: int, high: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(rng.randint(low, high))] for _ in range(count)]


async def one_request(
    session: aiohttp.ClientSession, url: str, body: dict[str, object]
) -> tuple[float, int, str]:
    """(TTFT seconds, output tokens, error) of one streamed completion."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft, tokens = 0.0, 0
    async with session.post(url, json=body) as response:
        if response.status != 200:
            return 0.0, 0, f"{response.status}: {(await response.text())[:200]}"
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:
                return 0.0, 0, json.dumps(chunk["error"])[:200]
            if chunk.get("choices") and not ttft:
                ttft = time.perf_counter() - start
            usage = chunk.get("usage")
            if usage:
                tokens = int(usage.get("completion_tokens") or 0)
    return ttft, tokens, ""


async def run_round(
    url: str,
    model: str,
    prompts: list[list[int]],
    max_tokens: int,
    concurrency: int,
    salt: str,
    temperature: float = 0.0,
) -> LoadRound:
    result = LoadRound()
    queue = list(enumerate(prompts))
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def worker() -> None:
            while queue:
                _, prompt = queue.pop(0)
                body = {
                    "model": model,
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                    "temperature": temperature,
                    "ignore_eos": True,
                    "cache_salt": salt,
                }
                ttft, tokens, error = await one_request(session, f"{url}/v1/completions", body)
                if error:
                    result.errors.append(error)
                else:
                    result.ttfts.append(ttft)
                    result.output_tokens += tokens

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.seconds = time.perf_counter() - start
    return result


def measured_round(
    name: str,
    url: str,
    model: str,
    prompts: list[list[int]],
    max_tokens: int,
    concurrency: int,
    temperature: float = 0.0,
) -> LoadRound:
    """One timed round on a fresh ``cache_salt`` (nothing cached from another round); raises
    when a request of ``name``'s failed."""
    salt = uuid.uuid4().hex
    result = asyncio.run(run_round(url, model, prompts, max_tokens, concurrency, salt, temperature))
    if result.errors:
        raise RuntimeError(f"{name}: {len(result.errors)} errors, {result.errors[0]}")
    return result


async def shared_prefix_ttft(
    url: str, model: str, prefix: list[int], suffixes: list[list[int]], salt: str
) -> tuple[float, list[float]]:
    """TTFT of the first request over ``prefix`` (cold) and of the next ones (prefix cached).

    A request of the same length over other tokens runs first, so that the cold figure is a
    prefill's, not a first long request's one-time costs (buffers, allocations)."""
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        ttfts: list[float] = []
        warm_up = [(t + 1) % 1000 + 5 for t in prefix]
        for suffix in [suffixes[0], *suffixes]:
            body = {
                "model": model,
                "prompt": (warm_up if not ttfts else prefix) + suffix,
                "max_tokens": 4,
                "temperature": 0,
                "ignore_eos": True,
                "cache_salt": salt,
            }
            ttft, _, error = await one_request(session, f"{url}/v1/completions", body)
            if error:
                raise RuntimeError(f"shared-prefix request failed: {error}")
            ttfts.append(ttft)
    return ttfts[1], ttfts[2:]
