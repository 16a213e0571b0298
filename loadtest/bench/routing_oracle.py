"""The routing benchmark's upper bound on reuse: how many prompt tokens an ideal router could
serve from the backends' prefix caches.

Each request's prompt is tokenized by a backend itself (``/tokenize``, the same chat template
and tokenizer the backends use), then walked in the workload's order: a request's leading full
blocks (of all its tokens but the last, as vLLM caches them) count as cacheable when an
earlier request had the same chain of blocks. That is a router with a cache of unbounded size
and a backend for every prefix; captured reuse is what a real run got as a share of it.
"""

from __future__ import annotations

import asyncio

import aiohttp

from loadtest.workloads.routing_mix import Chain, ChatRequest


async def prompt_tokens(backend: str, chains: list[Chain]) -> dict[int, list[int]]:
    """Each request's token ids (keyed by ``id(request)``), as ``backend`` renders them."""
    requests = [r for chain in chains for r in chain]
    limit = asyncio.Semaphore(8)
    result: dict[int, list[int]] = {}

    async def one(session: aiohttp.ClientSession, request: ChatRequest) -> None:
        async with (
            limit,
            session.post(f"{backend}/tokenize", json={"messages": request.messages}) as response,
        ):
            body = await response.json()
            if response.status != 200:
                raise RuntimeError(f"{backend}/tokenize answered {response.status}: {body}")
            result[id(request)] = body["tokens"]

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, r) for r in requests))
    return result


def cacheable_tokens(chains: list[Chain], tokens: dict[int, list[int]], block: int) -> int:
    """Tokens an unbounded cache could serve, the chains taken in order (each whole)."""
    seen: set[int] = set()
    total = 0
    for chain in chains:
        for request in chain:
            ids = tokens[id(request)]
            parent, matching = 0, True
            for start in range(0, (len(ids) - 1) // block * block, block):
                parent = hash((parent, tuple(ids[start : start + block])))
                if matching and parent in seen:
                    total += block
                else:
                    matching = False
                seen.add(parent)
    return total
