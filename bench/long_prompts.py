"""`python -m bench.long_prompts`: what a long prompt costs a router, side by side in one run.

Each router stands in front of the same two fast mock upstreams (``bench.mock_upstream``: an
answer of 16 SSE events at once, no model) and is sent, one request at a time, streamed chat
requests of about 1k, 8k, 32k and 128k tokens as a BPE tokenizer counts them (byte-level, 1,024
tokens, trained here on this repository's docs; a Llama-3 chat template: the shape of the vLLM
tier's tiny model): **single** calls (a new prompt each time) and **multi-turn** calls (a
conversation of that length, each call the previous one plus a tool result and an answer of
about 600 tokens; four calls a conversation). Per router, length and shape: its CPU per call
(the router's process tree) and the time to the first byte against the mocks' own (added TTFT,
p50).

The routers: kvgate approximate (the default profile) and precise (the prefix index keyed by
this tokenizer: it renders and tokenizes every request), Python and compiled (``make
compiled``), sglang-router and vllm-router ``cache_aware`` (their own venv, as
``bench.routing``); ``--before TREE`` adds kvgate precise from another checkout (``git
worktree add``), to compare a change side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from bench.routing_peers import (
    Backend,
    Peer,
    compiled_tree,
    default_profile_with,
    peer_bin,
    running_peer,
)
from loadtest.harness.proc_stats import cpu_seconds
from loadtest.harness.processes import external_process, free_port

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>"]
SPECIAL += ["<|eot_id|>"]
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{{ message['content'] | trim }}{{ '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
LENGTHS = (1_000, 8_000, 32_000, 128_000)
TURN_TOKENS = 600  # what each call of a conversation adds: a tool result and an answer
ROOT = Path(__file__).resolve().parents[1]


def _docs() -> list[str]:
    return [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))]


def build_tokenizer(out: Path) -> Tokenizer:
    """A byte-level BPE trained on the repository's docs, saved as a model folder."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_docs(), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
    )
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "chat_template.jinja").write_text(TEMPLATE)
    return tokenizer


class Text:
    """Random text of about a given number of tokens, from the docs' own words."""

    def __init__(self, tokenizer: Tokenizer, seed: int) -> None:
        words = " ".join(_docs()).split()
        self.words = words
        self.rng = random.Random(seed)
        sample = " ".join(self.rng.choices(words, k=2000))
        self.tokens_per_word = len(tokenizer.encode(sample).ids) / 2000

    def of(self, tokens: int) -> str:
        return " ".join(self.rng.choices(self.words, k=max(1, int(tokens / self.tokens_per_word))))


Chat = list[dict[str, str]]


def single_calls(text: Text, length: int, calls: int) -> Iterator[tuple[Chat, bool]]:
    for _ in range(calls):
        chat = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": text.of(length)},
        ]
        yield chat, True


def conversations(text: Text, length: int, calls: int) -> Iterator[tuple[Chat, bool]]:
    """Conversations of about ``length`` tokens, their last few calls each (``calls`` in all):
    each call the one before, a tool result and an answer (a tenth of the length at most).
    Each conversation's call before those is sent first, not measured (flagged False): the
    earlier turns came through the router, as they do when a conversation grows."""
    turn = min(TURN_TOKENS, length // 10)
    for first in range(0, calls, 4):
        history = [{"role": "system", "content": text.of(min(2_000, length // 4))}]
        size = min(2_000, length // 4)
        while size < length - 4 * turn:
            history += [{"role": "user", "content": text.of(turn - turn // 10)}]
            history += [{"role": "assistant", "content": text.of(turn // 10)}]
            size += turn
        yield list(history), False
        for _ in range(min(4, calls - first)):
            call = f"call_{len(history)}"
            history += [
                {"role": "tool", "tool_call_id": call, "content": text.of(turn - turn // 10)}
            ]
            yield list(history), True
            history += [{"role": "assistant", "content": text.of(turn // 10)}]


@dataclass
class Cell:
    cpu_ms: float
    ttft_ms: float


async def run_calls(url: str, bodies: list[tuple[bytes, bool]], pid: int | None) -> Cell:
    """The calls one at a time; the router's CPU per measured call and their p50 time to
    first byte."""
    firsts: list[float] = []
    cpu = 0.0
    async with aiohttp.ClientSession() as session:
        for body, measured in bodies:
            before = cpu_seconds(pid) if pid else 0.0
            start = time.perf_counter()
            async with session.post(
                url, data=body, headers={"content-type": "application/json"}
            ) as response:
                await response.content.readany()
                first = time.perf_counter() - start
                rest = await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{url}: {response.status} {rest[:300]!r}")
            if measured:
                firsts.append(first)
                cpu += cpu_seconds(pid) - before if pid else 0.0
    return Cell(cpu / len(firsts) * 1000, statistics.median(firsts) * 1000)


CALLS = {1_000: 100, 8_000: 40, 32_000: 16, 128_000: 8}  # calls per cell, times --scale


Calls = dict[tuple[str, int], list[tuple[bytes, bool]]]  # (shape, length): bodies, measured


def workloads(tokenizer: Tokenizer, scale: float) -> Calls:
    text = Text(tokenizer, seed=1)
    out: Calls = {}
    for length in LENGTHS:
        calls = max(2, round(CALLS[length] * scale))
        for shape, chats in (
            ("single", single_calls(text, length, calls)),
            ("multi-turn", conversations(text, length, calls)),
        ):
            out[shape, length] = [
                (json.dumps({"model": "mock", "messages": c, "stream": True}).encode(), measured)
                for c, measured in chats
            ]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="times the calls per cell")
    parser.add_argument("--before", type=Path, help="another checkout: its precise kvgate too")
    parser.add_argument("--no-peers", action="store_true", help="kvgate only")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-long-"))
    folder = workdir / "model"
    tokenizer = build_tokenizer(folder)
    bodies = workloads(tokenizer, args.scale)
    ports = [free_port(), free_port()]
    backends = [Backend(p, free_port()) for p in ports]
    precise = default_profile_with(
        {"mode": "precise", "block_size_tokens": 16, "tokenizer": str(folder)}
    )
    peers = [
        Peer("kvgate approximate", "kvgate", "default"),
        Peer("kvgate precise", "kvgate", "default", extra=precise),
    ]
    if compiled_tree() is not None:
        peers += [
            Peer("kvgate approximate, compiled", "kvgate", "default", compiled=True),
            Peer("kvgate precise, compiled", "kvgate", "default", compiled=True, extra=precise),
        ]
    bin_dir, why = (None, "--no-peers") if args.no_peers else peer_bin()
    if bin_dir is not None:
        peers += [
            Peer("sglang-router cache_aware", "sglang", "cache_aware"),
            Peer("vllm-router cache_aware", "vllm-router", "cache_aware"),
        ]
    else:
        print(f"peers skipped: {why}", file=sys.stderr)
    mock = [sys.executable, "-m", "bench.mock_upstream", "--port"]
    results: dict[str, dict[tuple[str, int], Cell]] = {}
    with (
        external_process([*mock, str(ports[0])], f"http://127.0.0.1:{ports[0]}/health"),
        external_process([*mock, str(ports[1])], f"http://127.0.0.1:{ports[1]}/health"),
    ):
        direct = f"http://127.0.0.1:{ports[0]}/v1/chat/completions"
        results["direct"] = {
            key: asyncio.run(run_calls(direct, b, None)) for key, b in bodies.items()
        }
        for peer in peers:
            results[peer.name] = measure(peer, backends, workdir, bin_dir, bodies, None)
        if args.before is not None:
            peer = Peer("kvgate precise (before)", "kvgate", "default", extra=precise)
            results[peer.name] = measure(peer, backends, workdir, bin_dir, bodies, args.before)
    report(results)
    return 0


def measure(
    peer: Peer,
    backends: list[Backend],
    workdir: Path,
    bin_dir: Path | None,
    bodies: Calls,
    tree: Path | None,
) -> dict[tuple[str, int], Cell]:
    print(f"{peer.name}...", file=sys.stderr, flush=True)
    with running_peer(peer, backends, "mock", workdir, bin_dir, tree=tree) as (base, pid, _):
        url = f"{base}/v1/chat/completions"
        asyncio.run(run_calls(url, bodies["single", LENGTHS[0]][:4], pid))  # warm-up
        return {key: asyncio.run(run_calls(url, b, pid)) for key, b in bodies.items()}


def report(results: dict[str, dict[tuple[str, int], Cell]]) -> None:
    direct = results.pop("direct")
    for shape in ("single", "multi-turn"):
        print(f"\n{shape}: router CPU ms per call / added TTFT p50 ms")
        print("| router | " + " | ".join(f"{n // 1000}k tokens" for n in LENGTHS) + " |")
        print("|---|" + "---:|" * len(LENGTHS))
        for name, cells in results.items():
            row = []
            for length in LENGTHS:
                cell = cells[shape, length]
                added = cell.ttft_ms - direct[shape, length].ttft_ms
                row.append(f"{cell.cpu_ms:.2f} / {added:+.2f}")
            print(f"| {name} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    raise SystemExit(main())
