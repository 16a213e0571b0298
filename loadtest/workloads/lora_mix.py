"""A LoRA mix over any workload: each chain (a conversation keeps its adapter), or with
``by_group`` each group of chains (an application's system prompt keeps its adapter), is sent
to one adapter drawn from a Zipf distribution over ``adapters`` (rank ``k`` with weight
``1 / k^s``), seeded; the adapter's name goes in the request's ``model`` field, as vLLM serves
adapters."""

from __future__ import annotations

import random
from dataclasses import replace

from loadtest.workloads.chats import Chain


def zipf_weights(count: int, exponent: float) -> list[float]:
    raw = [1 / (rank**exponent) for rank in range(1, count + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def with_adapters(
    chains: list[Chain], adapters: list[str], exponent: float, seed: int, by_group: bool = False
) -> list[Chain]:
    if not adapters:
        raise ValueError("a LoRA mix needs at least one adapter")
    rng = random.Random(seed)
    weights = zipf_weights(len(adapters), exponent)
    drawn: dict[str, str] = {}  # by_group: each group's adapter
    mixed: list[Chain] = []
    for chain in chains:
        group = chain[0].group if by_group and chain else ""
        adapter = drawn.get(group) if group else None
        if adapter is None:
            adapter = rng.choices(adapters, weights)[0]
            if group:
                drawn[group] = adapter
        mixed.append([replace(r, model=adapter) for r in chain])
    return mixed
