"""`make bench-routing`: kvgate's picker against sglang-router and vllm-router on the same
backends and the same seeded workloads (issue 19's measure).

Each run starts six fresh simulated backends (``kvgate backend``, cost model ``default``:
prefill 50 µs per uncached token, so a cache miss costs real time; caches cold), one router in
front of them, and drives one workload through it in an open loop (Poisson arrivals at
``--rate``): streamed chat completions of ``--output-tokens`` tokens. Workloads
(``loadtest.workloads.chats``):
``shared-prefix`` (24 system prompts of 1,600 tokens, 16 questions each; the prompts fill about
70% of the six caches) and ``multi-turn`` (24 six-turn conversations resending their history).
Per run: TTFT p50/p90/p99 from the client, requests/s, each backend's share of the requests
(from its ``vllm:request_success_total``), and captured reuse: the prompt tokens served from
cache (``cached_tokens`` in each response's usage) as a share of what an ideal router could
have served (``loadtest.workloads.reuse_oracle``). Rounds are interleaved (every router once per
round, the order reversed every other round, new prompts each round). Markdown to stdout,
JSON to ``build/bench-routing.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import aiohttp

from loadtest.bench.routing_peers import PEERS, Backend, Peer, peer_bin, running_peer
from loadtest.client.sse import StreamResult, stream_request
from loadtest.client.tokenize import in_order, prompt_tokens
from loadtest.harness.processes import backend_process, free_port
from loadtest.reports.stats import percentile
from loadtest.workloads.chats import Chain, multi_turn, shared_prefix
from loadtest.workloads.reuse_oracle import cacheable_tokens

ROOT = Path(__file__).resolve().parents[2]
MODEL = "kvgate-sim"
BACKENDS = 6
BLOCK = 16
NUM_BLOCKS = 560  # per backend: 24 prompts x 100 blocks fill ~70% of 6 x 560
WORKLOADS: dict[str, Callable[[int], list[Chain]]] = {
    "shared-prefix": lambda seed: shared_prefix(24, 16, 1600, seed),
    "multi-turn": lambda seed: multi_turn(24, 6, 600, 120, seed),
}


@contextmanager
def fresh_backends() -> Iterator[list[Backend]]:
    backends = [Backend(free_port(), free_port()) for _ in range(BACKENDS)]
    with ExitStack() as stack:
        for b in backends:
            args = ("--cost", "default", "--num-blocks", str(NUM_BLOCKS))
            stack.enter_context(
                backend_process(b.port, *args, "--kv-events-port", str(b.kv_events_port))
            )
        yield backends


async def drive(
    url: str, chains: list[Chain], rate: float, tokens: int, seed: int
) -> list[StreamResult]:
    """Open loop: chains start at seeded Poisson times, ``rate`` requests a second on average
    (a chain of ``n`` requests starts at ``rate / n``); a chain's next request is sent when the
    previous one has finished. A router that cannot keep up queues, as real traffic would."""
    rng = random.Random(seed)
    results: list[StreamResult] = []
    mean_chain = statistics.fmean(len(c) for c in chains)
    starts, at = [], 0.0
    for _ in chains:
        at += rng.expovariate(rate / mean_chain)
        starts.append(at)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        began = time.perf_counter()

        async def run_chain(chain: Chain, start: float) -> None:
            await asyncio.sleep(max(0.0, start - (time.perf_counter() - began)))
            for request in chain:
                body = request.body(MODEL, tokens)
                result = await stream_request(
                    session, f"{url}/v1/chat/completions", body, headers=request.headers
                )
                results.append(result)

        await asyncio.gather(*(run_chain(c, t) for c, t in zip(chains, starts, strict=True)))
    return results


async def served_counts(backends: list[Backend]) -> list[float]:
    counts = []
    async with aiohttp.ClientSession() as session:
        for b in backends:
            async with session.get(f"{b.url}/metrics") as response:
                text = await response.text()
            total = 0.0
            for line in text.splitlines():
                if line.startswith("vllm:request_success_total"):
                    total += float(line.rsplit(" ", 1)[1])
            counts.append(total)
    return counts


def one_run(
    peer: Peer, chains: list[Chain], oracle: int, args: argparse.Namespace, bin_dir: Path | None
) -> dict[str, float]:
    with (
        tempfile.TemporaryDirectory() as tmp,
        fresh_backends() as backends,
        running_peer(peer, backends, MODEL, Path(tmp), bin_dir) as url,
    ):
        time.sleep(0.5)  # subscriptions and health checks settle
        start = time.perf_counter()
        results = asyncio.run(drive(url, chains, args.rate, args.output_tokens, args.seed))
        seconds = time.perf_counter() - start
        counts = asyncio.run(served_counts(backends))
    ok = [r for r in results if r.status == 200 and not r.error]
    ttfts = [r.ttft * 1000 for r in ok]
    mean = statistics.fmean(counts) if counts else 0.0
    return {
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p90_ms": percentile(ttfts, 90),
        "ttft_p99_ms": percentile(ttfts, 99),
        "requests_per_s": len(ok) / seconds,
        "errors": len(results) - len(ok),
        "max_share": max(counts) / mean if mean else 0.0,
        "min_share": min(counts) / mean if mean else 0.0,
        "captured_reuse": sum(r.cached_tokens for r in ok) / oracle if oracle else 0.0,
    }


async def oracle_of(chains: list[Chain]) -> int:
    port = free_port()
    with backend_process(port, "--cost", "zero"):
        tokens = await prompt_tokens(f"http://127.0.0.1:{port}", chains)
    return cacheable_tokens(in_order(chains, tokens), BLOCK)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=float, default=80.0, help="requests/s, Poisson")
    parser.add_argument("--seed", type=int, default=0, help="of the arrival times")
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    parser.add_argument("--peer", action="append", help="only peers whose name contains this")
    args = parser.parse_args()
    peers = [p for p in PEERS if not args.peer or any(f in p.name for f in args.peer)]
    bin_dir, why = peer_bin()
    if bin_dir is None:
        print(f"peer routers unavailable ({why}): kvgate only")
        peers = [p for p in peers if p.router == "kvgate"]
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for number in range(args.rounds):
        order = peers if number % 2 == 0 else list(reversed(peers))
        for workload in args.workload or list(WORKLOADS):
            chains = WORKLOADS[workload](number)
            oracle = asyncio.run(oracle_of(chains))
            for peer in order:
                row = one_run(peer, chains, oracle, args, bin_dir)
                results.setdefault(workload, {}).setdefault(peer.name, []).append(row)
                print(
                    f"round {number} {workload} {peer.name}: TTFT p90 {row['ttft_p90_ms']:.0f} ms, "
                    f"{row['requests_per_s']:.1f} req/s, reuse {row['captured_reuse']:.0%}, "
                    f"shares {row['min_share']:.2f}-{row['max_share']:.2f}, "
                    f"errors {row['errors']:.0f}",
                    flush=True,
                )
    report(results)
    out = ROOT / "build" / "bench-routing.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    return 0


COLUMNS = (
    ("TTFT p50 ms", "ttft_p50_ms", "{:.0f}"),
    ("TTFT p90 ms", "ttft_p90_ms", "{:.0f}"),
    ("TTFT p99 ms", "ttft_p99_ms", "{:.0f}"),
    ("req/s", "requests_per_s", "{:.1f}"),
    ("captured reuse", "captured_reuse", "{:.0%}"),
    ("min share", "min_share", "{:.2f}"),
    ("max share", "max_share", "{:.2f}"),
    ("errors", "errors", "{:.0f}"),
)


def report(results: dict[str, dict[str, list[dict[str, float]]]]) -> None:
    """Per workload: each router's median over the rounds, and its TTFT p90 against round
    robin's (sglang-router round_robin) as a ratio."""
    for workload, peers in results.items():
        medians = {
            name: {key: statistics.median(r[key] for r in rows) for _, key, _ in COLUMNS}
            for name, rows in peers.items()
        }
        baseline = medians.get("sglang-router round_robin", {}).get("ttft_p90_ms")
        print(f"\n{workload} (median of {len(next(iter(peers.values())))} rounds)\n")
        print("| router | " + " | ".join(c for c, _, _ in COLUMNS) + " | RR p90 ÷ it |")
        print("|---|" + "---:|" * (len(COLUMNS) + 1))
        for name, row in medians.items():
            cells = [fmt.format(row[key]) for _, key, fmt in COLUMNS]
            ratio = f"{baseline / row['ttft_p90_ms']:.1f}" if baseline else "—"
            print(f"| {name} | " + " | ".join(cells) + f" | {ratio} |")


if __name__ == "__main__":
    raise SystemExit(main())
