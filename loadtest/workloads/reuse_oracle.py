"""The upper bound of captured reuse: how many prompt tokens an ideal router could serve from
the backends' prefix caches.

Given each request's token ids (as the backends tokenize them), the workload is walked in
order: a request's leading full blocks (of all its tokens but the last, as vLLM caches them)
count as cacheable when an earlier request had the same chain of blocks. That is a router with
a cache of unbounded size and a backend for every prefix; captured reuse is what a real run
got as a share of it.
"""

from __future__ import annotations

from collections.abc import Iterable


def cacheable_tokens(prompts: Iterable[list[int]], block: int) -> int:
    """Tokens an unbounded cache of ``block``-token blocks could serve, prompts in order."""
    return sum(cacheable_per_prompt(prompts, block))


def cacheable_per_prompt(prompts: Iterable[list[int]], block: int) -> list[int]:
    """Of each prompt in order, the tokens an unbounded cache of ``block``-token blocks could
    serve."""
    seen: set[int] = set()
    counts: list[int] = []
    for ids in prompts:
        parent, matching, total = 0, True, 0
        for start in range(0, (len(ids) - 1) // block * block, block):
            parent = hash((parent, tuple(ids[start : start + block])))
            if matching and parent in seen:
                total += block
            else:
                matching = False
            seen.add(parent)
        counts.append(total)
    return counts
