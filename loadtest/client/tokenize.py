"""Token ids of a workload's prompts, as a vLLM-compatible server renders them (``POST
/tokenize`` with the chat messages: the same chat template and tokenizer it serves with)."""

from __future__ import annotations

import asyncio

import aiohttp

from loadtest.workloads.chats import Chain, ChatRequest


async def prompt_tokens(
    server: str, chains: list[Chain], headers: dict[str, str] | None = None
) -> dict[int, list[int]]:
    """Each request's token ids, keyed by ``id(request)``."""
    requests = [r for chain in chains for r in chain]
    limit = asyncio.Semaphore(8)
    result: dict[int, list[int]] = {}

    async def one(session: aiohttp.ClientSession, request: ChatRequest) -> None:
        body: dict[str, object] = {"messages": request.messages}
        if request.model:
            body["model"] = request.model
        async with limit, session.post(f"{server}/tokenize", json=body) as response:
            answer = await response.json(content_type=None)
            if response.status != 200:
                raise RuntimeError(f"{server}/tokenize answered {response.status}: {answer}")
            result[id(request)] = answer["tokens"]

    async with aiohttp.ClientSession(headers=headers) as session:
        await asyncio.gather(*(one(session, r) for r in requests))
    return result


def in_order(chains: list[Chain], tokens: dict[int, list[int]]) -> list[list[int]]:
    """The prompts' ids in the workload's order (chains whole, one after another)."""
    return [tokens[id(r)] for chain in chains for r in chain]
