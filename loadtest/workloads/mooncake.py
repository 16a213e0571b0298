"""Request traces in Mooncake's format (FAST'25 release; NVIDIA AIPerf's ``mooncake_trace``), one
request a line (plain or ``.gz``): ``{"timestamp": ms, "input_length": tokens,
"output_length": tokens, "hash_ids": [ids of 512-token blocks]}``, where equal leading ids mean a
shared prefix.

Replayed as text: each block id becomes a deterministic block of pseudo-words
(``block_tokens`` characters, a token each with a byte tokenizer), so requests whose leading
ids are equal share byte-identical prefixes; the last block is cut to the request's length.
Blocks of 512 tokens become ``block_tokens`` (lengths in proportion), times are multiplied by
``time_scale`` (0.1: ten times faster), outputs by ``output_scale`` (then capped at
``max_output``). A window picks what is replayed: requests from ``start`` seconds of the trace
for ``duration`` seconds, every ``every``-th conversation (requests that share their first
block), ``skip`` requests left out, ``limit`` at most. Each request is a chain of its own, sent
at its own time (``ChatRequest.at``). ``ideal_reuse`` is the share of the replayed blocks an
infinite cache that saw every earlier replayed request could serve.
"""

from __future__ import annotations

import gzip
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

    block_tokens: int = TRACE_BLOCK  # tokens a trace block becomes
    time_scale: float = 1.0  # the trace's times multiplied by this
    output_scale: float = 1.0  # the trace's output lengths multiplied by this
    max_output: int | None = None  # output tokens at most
    start: float = 0.0  # seconds into the trace the window begins
    duration: float | None = None  # seconds of the trace the window spans
    every: int = 1  # every k-th conversation (requests sharing their first block)
    skip: int = 0  # requests of the window left out from its start
    limit: int | None = None  # requests replayed at most


def load_trace(path: Path) -> list[TraceRequest]:
    """Every request of the file at ``path``; ``DatasetError`` naming the line of a bad one."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        lines = raw.decode().splitlines()
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile) as exc:
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


def window(requests: list[TraceRequest], replay: Replay) -> list[TraceRequest]:
    """The requests ``replay`` picks, in the trace's order."""
    first = requests[0].timestamp if requests else 0.0
    since, until = first + replay.start * 1000, math.inf
    if replay.duration is not None:
        until = since + replay.duration * 1000
    chosen = [r for r in requests if since <= r.timestamp < until]
    if replay.every > 1:
        conversations: dict[int, int] = {}
        for request in chosen:
            conversations.setdefault(request.hash_ids[0], len(conversations))
        chosen = [r for r in chosen if conversations[r.hash_ids[0]] % replay.every == 0]
    chosen = chosen[replay.skip :]
    return chosen if replay.limit is None else chosen[: replay.limit]


def trace_chains(requests: list[TraceRequest], replay: Replay, seed: int = 0) -> list[Chain]:
    """The requests ``requests`` (a window) as chains of one chat request each, timed from the
    first."""
    if not requests:
        return []
    first = requests[0].timestamp
    blocks: dict[int, str] = {}
    chains: list[Chain] = []
    for request in requests:
        length = max(1, math.ceil(request.input_length * replay.block_tokens / TRACE_BLOCK))
        prompt = "".join(_block(blocks, i, replay.block_tokens, seed) for i in request.hash_ids)
        output = max(1, round(request.output_length * replay.output_scale))
        if replay.max_output is not None:
            output = min(output, replay.max_output)
        at = (request.timestamp - first) / 1000 * replay.time_scale
        message = {"role": "user", "content": prompt[:length]}
        chains.append(
            [ChatRequest([message], group=f"trace-{request.hash_ids[0]}", max_tokens=output, at=at)]
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
