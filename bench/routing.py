"""`make bench-routing`: kvgate's picker against sglang-router, vllm-router and Dynamo's KV
router on the same backends and the same seeded workloads.

Each run starts ``--backends`` fresh simulated backends (``kvgate backend``, cost model
``default``: prefill 50 µs per uncached token, so a cache miss costs real time; caches cold),
one router in front of them, and drives one workload through it with kvgate's load tester
(``loadtest.run.driver``): open loop, Poisson arrivals over the ramp ``--stages`` (rate:seconds),
streamed chat completions of ``--output-tokens`` tokens. Workloads
(``loadtest.workloads.chats``), sized to the backends: ``shared-prefix`` (4 system prompts of
1,600 tokens per backend, which fill about 70% of the caches; many questions each, shuffled),
``multi-turn`` (six-turn conversations resending their history), ``shared-sessions``
(conversations over a few shared system prompts, as an assistant's users hold them: 3-6
prompts of 1,200-2,400 tokens, 4-8 turns, by round), ``tight-shared-prefix`` (the
shared-prefix workload on caches of 547 blocks, its prompts 1,200-2,000 tokens by round: little
room to spare), ``lora-mix`` (the
shared-prefix workload, each system prompt's requests for one of 8 LoRA adapters drawn from a
Zipf distribution; every backend serves all 8 with 2 resident at once, and swapping one in
costs a step 20 ms), and ``trace`` (a window of the Mooncake-format production trace in
``../shared/data/traces/``, at its own times sped up 20x, 512-token blocks replayed as 32
tokens, on caches of 4,096 blocks: ``loadtest.workloads.mooncake``).

Per run: TTFT p50/p90/p99 and output tokens/s from the client, TTFT p90 per stage, each
backend's share of the requests and its prefix-cache hit rate (from ``/metrics`` before and
after), captured reuse (cached prompt tokens ÷ what an ideal router could have served of the
requests sent, in their order: ``loadtest.workloads.reuse_oracle``), the router's CPU time
per routed request (its process tree, from /proc), and for kvgate its cold misses: the share of
its picks that passed over an endpoint holding more of the prompt which the filters had kept
(``kvgate_epp_warm_diverted_total``; a warm endpoint filtered out as overloaded is not one).
Rounds are interleaved (every router once per round, the order reversed every other round, new
prompts each round). Markdown to stdout, JSON to ``build/bench-routing.json``, a plot of TTFT
p90 per stage to ``build/bench-routing.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

from bench.dynamo_peer import dynamo_python
from bench.pd_transfer import metric_sum
from bench.routing_agents import (
    AGENT_WORKLOADS,
    agent_chains,
    agent_row,
    agent_stages,
    host_blocks,
)
from bench.routing_peers import (
    PEERS,
    Backend,
    Peer,
    compiled_tree,
    peer_bin,
    running_peer,
)
from bench.routing_report import plot_stages, report
from bench.ttft_floor import idle_ttft_p90_ms
from loadtest.client.backend_metrics import deltas, scrape_all
from loadtest.harness.proc_stats import cpu_seconds
from loadtest.harness.processes import backend_process, free_port
from loadtest.reports.serving_metrics import benchmark_result
from loadtest.reports.stage_report import Stage, stage_report
from loadtest.run.driver import LoadPlan, run_load
from loadtest.run.session import BLOCK, sent_prompts, workload_tokens
from loadtest.workloads.arrivals import parse_stages
from loadtest.workloads.chats import Chain, multi_turn, shared_prefix
from loadtest.workloads.lora_mix import with_adapters
from loadtest.workloads.mooncake import Replay, load_trace, trace_chains, window
from loadtest.workloads.reuse_oracle import cacheable_per_prompt

ROOT = Path(__file__).resolve().parents[1]
MODEL = "kvgate-sim"
NUM_BLOCKS = 560  # per backend: 4 prompts of 100 blocks each fill ~70% of it
TIGHT_NUM_BLOCKS = 547  # per backend, for tight-shared-prefix
WORKLOADS = (
    "shared-prefix",
    "multi-turn",
    "shared-sessions",
    "tight-shared-prefix",
    "lora-mix",
    "trace",
    *AGENT_WORKLOADS,
)
# per round (the seed picks one): the shared sessions' (system prompts, turns, prompt chars),
# the tight ramp's system prompt chars
SESSION_SIZES = ((4, 6, 1600), (3, 8, 2400), (6, 4, 1200))
TIGHT_PREFIX_CHARS = (1600, 1200, 2000)
TRACE = ROOT.parent / "shared" / "data" / "traces" / "synthetic_trace.jsonl"
# the trace: a window of at most TRACE_REQUESTS from its TRACE_START-th request (the next window
# each round), 512-token blocks as 32 tokens, 20x its clock, on caches of TRACE_NUM_BLOCKS
TRACE_START, TRACE_REQUESTS, TRACE_NUM_BLOCKS = 2000, 512, 4096
TRACE_REPLAY = Replay(block_tokens=32, time_scale=1 / 20, max_output=32)
ADAPTERS = tuple(f"lora-{i}" for i in range(8))
MAX_LORAS = 2  # resident per backend


def workload(name: str, backends: int, requests: int, seed: int) -> list[Chain]:
    if name == "trace":
        count = min(requests, TRACE_REQUESTS)
        replay = replace(TRACE_REPLAY, skip=TRACE_START + seed * count, limit=count)
        return trace_chains(window(load_trace(TRACE), replay), replay)
    if name == "multi-turn":
        return multi_turn(math.ceil(requests / 6), 6, 600, 120, seed)
    if name in AGENT_WORKLOADS:
        return agent_chains(seed)
    if name == "shared-sessions":
        systems, turns, chars = SESSION_SIZES[seed % len(SESSION_SIZES)]
        return multi_turn(math.ceil(requests / turns), turns, chars, 120, seed, systems)
    groups = 4 * backends
    chars = TIGHT_PREFIX_CHARS[seed % 3] if name == "tight-shared-prefix" else 1600
    chains = shared_prefix(groups, math.ceil(requests / groups), chars, seed)
    if name == "lora-mix":
        return with_adapters(chains, list(ADAPTERS), 1.0, seed, by_group=True)
    return chains


def blocks_of(name: str) -> int:
    """KV blocks per backend: the trace's longer prompts need more, the tight ramp has fewer."""
    if name == "trace":
        return TRACE_NUM_BLOCKS
    return TIGHT_NUM_BLOCKS if name == "tight-shared-prefix" else NUM_BLOCKS


def adapters_of(name: str) -> tuple[str, ...]:
    return ADAPTERS if name == "lora-mix" else ()


def backend_args(adapters: tuple[str, ...]) -> tuple[str, ...]:
    """A simulated backend serving ``adapters`` (the simulated runner has no weights to load)."""
    if not adapters:
        return ()
    modules = [f"{a}=/nonexistent/{a}" for a in adapters]
    return ("--max-loras", str(MAX_LORAS), "--lora-modules", *modules)


@contextmanager
def fresh_backends(
    count: int,
    adapters: tuple[str, ...] = (),
    num_blocks: int = NUM_BLOCKS,
    host: int = 0,
    cost: str = "default",
) -> Iterator[list[Backend]]:
    """``count`` fresh simulated backends of ``num_blocks`` each (and a host tier of ``host``
    blocks), on the ``cost`` model."""
    backends = [Backend(free_port(), free_port()) for _ in range(count)]
    longest = str(min(num_blocks * 16, 32_768))  # the trace's longest prompts take 12k tokens
    with ExitStack() as stack:
        for b in backends:
            args = ["--cost", cost, "--num-blocks", str(num_blocks), "--max-model-len"]
            args += [longest, *backend_args(adapters)]
            args += ["--cpu-offload-blocks", str(host)] if host else []
            args += ["--kv-retention-owner-fraction", "0.5"]  # one tenant: all the bound
            stack.enter_context(
                backend_process(b.port, *args, "--kv-events-port", str(b.kv_events_port))
            )
        yield backends


def one_run(
    peer: Peer,
    chains: list[Chain],
    tokens: list[list[int]],
    args: argparse.Namespace,
    bin_dir: Path | None,
    adapters: tuple[str, ...] = (),
    name: str = "",
) -> dict[str, float]:
    num_blocks = blocks_of(name)
    stages = [Stage(rate=r, duration=s) for r, s in parse_stages(args.stages)]
    if name in AGENT_WORKLOADS:
        stages = agent_stages()
    host = host_blocks(name, num_blocks)
    with (
        tempfile.TemporaryDirectory() as tmp,
        fresh_backends(args.backends, adapters, num_blocks, host) as backends,
        running_peer(peer, backends, MODEL, Path(tmp), bin_dir, adapters) as (url, pid, relays),
    ):
        time.sleep(0.5)  # subscriptions and health checks settle
        urls = [b.url for b in backends]
        before = asyncio.run(scrape_all(urls))
        cpu_before, relay_before = cpu_seconds(pid), sum(map(cpu_seconds, relays))
        plan = LoadPlan(url, MODEL, chains, stages, args.output_tokens, seed=args.seed)
        run = asyncio.run(run_load(plan))
        cpu = cpu_seconds(pid) - cpu_before
        relay_cpu = sum(map(cpu_seconds, relays)) - relay_before
        counters = deltas(before, asyncio.run(scrape_all(urls)), urls)
        own = own_counters(url) if peer.router == "kvgate" else {}
    result = benchmark_result(run.records, run.duration)
    prompts = sent_prompts(tokens, run.records)
    cached = cacheable_per_prompt(prompts, BLOCK)  # what an ideal router could have cached
    oracle = sum(cached)
    ok = [r for r in run.records if r.ok]
    served = [row["requests"] for row in counters["per_backend"].values()]  # type: ignore[attr-defined]
    mean = statistics.fmean(served) if served else 0.0
    per_stage = stage_report(run.records, stages, run.stage_seconds)
    row = {
        "ttft_p50_ms": float(result["median_ttft_ms"]),  # type: ignore[arg-type]
        "ttft_p90_ms": float(result["p90_ttft_ms"]),  # type: ignore[arg-type]
        "ttft_p99_ms": float(result["p99_ttft_ms"]),  # type: ignore[arg-type]
        "output_tokens_per_s": float(result["output_throughput"]),  # type: ignore[arg-type]
        "requests_per_s": float(result["request_throughput"]),  # type: ignore[arg-type]
        "errors": float(len(run.records) - len(ok)),
        "max_share": max(served) / mean if mean else 0.0,
        "min_share": min(served) / mean if mean else 0.0,
        "hit_rate": float(counters["prefix_cache_hit_rate"] or 0.0),  # type: ignore[arg-type]
        "captured_reuse": sum(r.cached_tokens for r in ok) / oracle if oracle else 0.0,
        "cpu_ms_per_request": cpu * 1000 / len(ok) if ok else math.nan,
        "relay_cpu_ms_per_request": relay_cpu * 1000 / len(ok) if ok and relays else math.nan,
        "cold_misses": own.get("warm_diverted", math.nan) / own["picks"] if own else math.nan,
        "scrapes_per_request": own["scrapes"] / len(ok) if own and ok else math.nan,
        "ttft_floor_p90_ms": idle_ttft_p90_ms(prompts, cached),
    }
    for number, stage in enumerate(per_stage):
        latency = stage["successes"]["latency"]  # type: ignore[index]
        row[f"stage_{number}_ttft_p90_ms"] = latency["time_to_first_token"]["p90"] * 1000
    if name in AGENT_WORKLOADS:
        row.update(agent_row(run.records, args.backends * num_blocks * 16))
    return row


def own_counters(url: str) -> dict[str, float]:
    """kvgate's picks, the picks that passed over an endpoint holding more of the prompt which
    the filters had kept (``kvgate_epp_warm_diverted_total``: cold misses), and its scrapes."""
    text = metrics_text(url)
    picks = metric_sum(text, "kvgate_epp_decisions_total", {})
    return {
        "picks": picks or math.nan,
        "warm_diverted": metric_sum(text, "kvgate_epp_warm_diverted_total", {}),
        "scrapes": metric_sum(text, "kvgate_epp_scrapes_total", {}),
    }


def metrics_text(url: str) -> str:
    """The /metrics page of the server at ``url``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return str(response.read().decode())


async def tokenized(chains: list[Chain], adapters: tuple[str, ...] = ()) -> list[list[int]]:
    """The prompts' ids, in workload order, as a backend of the same kind renders them."""
    port = free_port()
    with backend_process(port, "--cost", "zero", *backend_args(adapters)):
        return await workload_tokens(f"http://127.0.0.1:{port}", chains)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--backends", type=int, default=8)
    parser.add_argument("--stages", default="50:8,100:8", help="the ramp, RATE:SECONDS,...")
    parser.add_argument("--seed", type=int, default=0, help="of the arrival times")
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--workload", choices=WORKLOADS, action="append")
    parser.add_argument("--peer", action="append", help="only peers whose name contains this")
    args = parser.parse_args()
    spans = parse_stages(args.stages)
    if any(seconds == 0 for _, seconds in spans):
        parser.error("every stage needs its seconds here")
    requests = math.ceil(sum(rate * seconds for rate, seconds in spans) * 1.2)
    peers = [p for p in PEERS if not args.peer or any(f in p.name for f in args.peer)]
    if compiled_tree() is None and any(p.compiled for p in peers):
        print("no compiled build (make compiled): the compiled kvgate row is left out")
        peers = [p for p in peers if not p.compiled]
    bin_dir, why = peer_bin()
    if bin_dir is None:
        print(f"peer routers unavailable ({why}): kvgate only")
        peers = [p for p in peers if p.router in ("kvgate", "floor", "dynamo")]
    if any(p.router == "dynamo" for p in peers):
        python, why = dynamo_python()
        if python is None:
            print(f"Dynamo unavailable ({why}): left out")
            peers = [p for p in peers if p.router != "dynamo"]
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for number in range(args.rounds):
        order = peers if number % 2 == 0 else list(reversed(peers))
        for name in args.workload or WORKLOADS:
            if name == "trace" and not TRACE.exists():
                print(f"no trace at {TRACE}: the trace workload is left out")
                continue
            chains = workload(name, args.backends, requests, number)
            adapters = adapters_of(name)
            tokens = asyncio.run(tokenized(chains, adapters))
            for peer in order:
                if adapters and peer.router == "dynamo":
                    continue  # each adapter would need a model card in Dynamo's discovery
                row = one_run(peer, chains, tokens, args, bin_dir, adapters, name)
                results.setdefault(name, {}).setdefault(peer.name, []).append(row)
                print(
                    f"round {number} {name} {peer.name}: TTFT p90 {row['ttft_p90_ms']:.0f} ms, "
                    f"{row['output_tokens_per_s']:.0f} tok/s, reuse {row['captured_reuse']:.0%}, "
                    f"shares {row['min_share']:.2f}-{row['max_share']:.2f}, "
                    f"CPU {row['cpu_ms_per_request']:.2f} ms/req, errors {row['errors']:.0f}, "
                    f"cold misses {row['cold_misses']:.1%}",
                    flush=True,
                )
    report(results)
    out = ROOT / "build" / "bench-routing.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    plot = plot_stages(results, [rate for rate, _ in spans], ROOT / "build" / "bench-routing.png")
    if plot is not None:
        print(f"\nwrote {out} and {plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
