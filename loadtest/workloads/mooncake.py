"""Request traces in Mooncake's format (FAST'25 release; NVIDIA AIPerf's ``mooncake_trace``), one
request a line: ``{"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [ids of 512-token blocks]}``, where equal leading ids mean a shared prefix.

Replayed as text: each block id becomes a deterministic block of pseudo-words
(``block_tokens`` characters, a token each with a byte tokenizer), so requests whose leading
ids are equal share byte-identical prefixes; the last block is cut to the request's length.
Blocks are scaled from 512 tokens to ``block_tokens`` (lengths in proportion), the clock sped up
``speedup`` times, and output lengths capped at ``max_output``. Each request is a chain of its
own, sent at its own time (``ChatRequest.at``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from loadtest.workloads.chats import Chain, ChatRequest, text
from loadtest.workloads.sharegpt import DatasetError

TRACE_BLOCK = 512  # tokens per hash id in the trace


@dataclass(frozen=True)
class TraceRequest:
    timestamp: float  # milliseconds from the trace's start
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class Replay:
    """How a trace is replayed here."""

    block_tokens: int = 64  # tokens a trace block becomes (512: as recorded)
    speedup: float = 10.0  # the trace's clock, this many times faster
    max_output: int = 32  # output tokens at most
    skip: int = 0  # requests left out from the start
    limit: int | None = None  # requests replayed at most


def load_trace(path: Path) -> list[TraceRequest]:
    """Every request of the file at ``path``; ``DatasetError`` naming the line of a bad one."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise DatasetError(f"{path}: {exc}") from exc
    requests = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            request = TraceRequest(
                float(item["timestamp"]),
                int(item["input_length"]),
                int(item["output_length"]),
                tuple(int(i) for i in item["hash_ids"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise DatasetError(f"{path}:{number}: not a Mooncake trace line ({exc})") from exc
        if request.input_length < 1 or request.output_length < 0 or not request.hash_ids:
            raise DatasetError(f"{path}:{number}: needs input_length >= 1 and hash_ids")
        requests.append(request)
    return requests


def trace_chains(requests: list[TraceRequest], replay: Replay, seed: int = 0) -> list[Chain]:
    """The requests of ``replay``'s window as chains of one chat request each, timed from the
    window's first request."""
    window = requests[replay.skip :]
    if replay.limit is not None:
        window = window[: replay.limit]
    if not window:
        return []
    start = window[0].timestamp
    blocks: dict[int, str] = {}
    chains: list[Chain] = []
    for request in window:
        length = max(1, math.ceil(request.input_length * replay.block_tokens / TRACE_BLOCK))
        prompt = "".join(_block(blocks, i, replay.block_tokens, seed) for i in request.hash_ids)
        message = {"role": "user", "content": prompt[:length]}
        chains.append(
            [
                ChatRequest(
                    [message],
                    group=f"trace-{request.hash_ids[0]}",
                    max_tokens=max(1, min(request.output_length, replay.max_output)),
                    at=(request.timestamp - start) / 1000 / replay.speedup,
                )
            ]
        )
    return chains


def ideal_reuse(requests: Iterable[TraceRequest]) -> float:
    """The share of prompt blocks an infinite cache that saw every earlier request holds."""
    seen: set[int] = set()
    held = total = 0
    for request in requests:
        for block in request.hash_ids:
            total += 1
            held += block in seen
            seen.add(block)
    return held / total if total else 0.0


def _block(blocks: dict[int, str], block_id: int, tokens: int, seed: int) -> str:
    found = blocks.get(block_id)
    if found is None:
        found = blocks[block_id] = text(random.Random(block_id * 1_000_003 + seed), tokens)
    return found
