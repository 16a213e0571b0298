"""`make bench-replicas`: K gateway replicas behind a real Envoy doing round-robin, as production
runs them, against one replica; then the same under faults.

Each run starts fresh processes (``bench.replica_stack``): ``--backends`` simulated
backends (cost model ``default``: 50 µs per uncached prompt token; ``--num-blocks`` each, so the
workload's prefixes fill about 70% of the caches), K ``kvgate gateway`` processes (separate, as
on K hosts), Envoy in front, and a redis-server when the replicas share their picks
(``epp.replicas``). The load tester sends one workload through Envoy (open loop, Poisson at
``--rate``, streamed chat completions of ``--output-tokens``): ``shared-prefix`` (the demo's:
16 system prompts of 1,600 tokens, many short questions each), ``multi-turn`` (six-turn
conversations resending their history) or ``trace`` (a window of a Mooncake-format production
trace, ``--trace``, at its own times sped up ``--speedup`` times, blocks of 512 tokens replayed
as 32: ``loadtest.workloads.mooncake``; 4,096 KV blocks per backend for its longer prompts) or
``agentic`` (``make bench-routing``'s coding-agent sessions, ``bench.routing_agents``: 80
sessions, their calls at ``--rate`` on average).

Setups: K=1 and K=3 with the default (approximate) picker, K=3 sharing picks through Redis, the
same three in precise mode (the backends' KV events), and K=3 blind to caches (least-in-flight).
Faults (``--fault``, on K=3 sharing its picks; at 40% of the run): ``replica`` SIGKILLs one
gateway, ``redis`` stops Redis, ``engine`` SIGKILLs one backend. ``--greedy-streams N``: then an
engine killed under N greedy streams on real (torch) models, every joined answer compared with
the uninterrupted one (``bench.engine_failover``).

Per setup, pooled over the interleaved rounds: failed requests, TTFT p50/p90, cached prompt
share (cached ÷ prompt tokens, from the answers' usage), captured reuse (cached tokens ÷ what an
ideal router could have served: ``loadtest.workloads.reuse_oracle``); with a fault, the failed
requests sent after it, and the captured reuse (the routing's affinity) of the requests sent
before it and after it. Markdown to stdout, JSON to
``build/bench-replicas.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.engine_failover import failover
from bench.engine_failover import report as report_failover
from bench.replica_stack import MODEL, Setup, Stack, running_stack
from bench.routing_agents import agent_chains
from loadtest.harness.envoy import envoy_binary
from loadtest.harness.processes import backend_process, free_port
from loadtest.reports.records import RequestRecord
from loadtest.reports.stage_report import Stage
from loadtest.reports.stats import percentile
from loadtest.run.driver import LoadPlan, run_load
from loadtest.run.session import BLOCK, workload_tokens
from loadtest.workloads.chats import Chain, multi_turn, shared_prefix
from loadtest.workloads.mooncake import Replay, load_trace, trace_chains, window
from loadtest.workloads.reuse_oracle import cacheable_per_prompt

ROOT = Path(__file__).resolve().parents[1]
SETUPS = (
    Setup("K=1 approximate", 1),
    Setup("K=3 approximate, not shared", 3),
    Setup("K=3 approximate, shared", 3, shared=True),
    Setup("K=1 precise", 1, "precise"),
    Setup("K=3 precise, not shared", 3, "precise"),
    Setup("K=3 precise, shared", 3, "precise", shared=True),
    Setup("K=3 least-in-flight", 3, "least-in-flight"),
)
FAULTS = ("replica", "redis", "engine")
FAULT_AT = 0.4  # of the run's planned length
WORKLOADS = ("shared-prefix", "multi-turn", "trace", "agentic")
TRACE = ROOT.parent / "shared" / "data" / "traces" / "synthetic_trace.jsonl"
TRACE_START = 2000  # the trace's first request replayed (its busiest reuse)
TRACE_BLOCK_TOKENS = 32  # a trace block (512 tokens) becomes this many
TRACE_NUM_BLOCKS = 4096  # KV blocks per backend for the trace's longer prompts


def workload(name: str, args: argparse.Namespace, seed: int) -> list[Chain]:
    """Round ``seed``'s requests: new prompts each round (the trace: its next window)."""
    requests = args.requests
    if name == "multi-turn":
        return multi_turn(math.ceil(requests / 6), 6, 600, 120, seed)
    if name == "agentic":  # its own size: 80 sessions (``bench.routing_agents``), at --rate
        return agent_chains(seed)
    if name == "trace":
        replay = Replay(TRACE_BLOCK_TOKENS, 1 / args.speedup, max_output=args.output_tokens)
        replay = replace(replay, skip=TRACE_START + seed * requests, limit=requests)
        return trace_chains(window(load_trace(args.trace), replay), replay)
    return shared_prefix(16, math.ceil(requests / 16), 1600, seed)[:requests]


def break_one(stack: Stack, fault: str) -> None:
    """What ``fault`` names, now."""
    if fault == "replica":
        stack.gateways[0].kill()
    elif fault == "engine":
        stack.backends[0].kill()
    elif fault == "redis" and stack.redis is not None:
        stack.redis.stop()


def one_run(
    setup: Setup,
    chains: list[Chain],
    args: argparse.Namespace,
    envoy: Path,
    fault: str | None,
    num_blocks: int,
) -> tuple[list[RequestRecord], float | None]:
    """The run's records, and when (seconds into it) the fault struck."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_stack(setup, args.backends, num_blocks, Path(tmp), envoy) as stack,
    ):
        time.sleep(0.5)  # subscriptions, scrapes and health checks settle
        requests = sum(len(c) for c in chains)
        last = chains[-1][0].at
        length = last if last is not None else requests / args.rate
        plan = LoadPlan(stack.url, MODEL, chains, [Stage(rate=args.rate)], args.output_tokens)
        plan.max_requests = requests
        struck: float | None = None
        timer = None
        if fault is not None:
            at = FAULT_AT * length
            struck = at
            timer = threading.Timer(at, break_one, (stack, fault))
            timer.start()
        try:
            run = asyncio.run(run_load(plan))
        finally:
            if timer is not None:
                timer.cancel()
    return run.records, struck


@dataclass
class Pooled:
    """One setup's runs, pooled: their requests, what an ideal router could have served of
    each (``loadtest.workloads.reuse_oracle``, in the order they were sent), and (with a
    fault) which were sent before and after it struck."""

    records: list[RequestRecord] = field(default_factory=list)
    cacheable: list[int] = field(default_factory=list)  # per record, as ``records``
    struck: list[bool | None] = field(default_factory=list)  # per record: sent after the fault

    def add(self, tokens: list[list[int]], run: list[RequestRecord], fault: float | None) -> None:
        sent = sorted((r for r in run if r.index >= 0), key=lambda r: r.start)
        self.records += sent
        self.cacheable += cacheable_per_prompt([tokens[r.index] for r in sent], BLOCK)
        self.struck += [None if fault is None else r.start >= fault for r in sent]

    def summary(self) -> dict[str, float]:
        ok = [r for r in self.records if r.ok]
        ttfts = sorted(r.ttft * 1000 for r in ok)
        row = {
            "requests": float(len(self.records)),
            "failed": float(len(self.records) - len(ok)),
            "ttft_p50_ms": percentile(ttfts, 50) if ttfts else math.nan,
            "ttft_p90_ms": percentile(ttfts, 90) if ttfts else math.nan,
            "cached_share": _share(ok),
            "captured_reuse": self._captured(lambda after: True),
        }
        if any(s is not None for s in self.struck):
            row["captured_before"] = self._captured(lambda after: after is False)
            row["captured_after"] = self._captured(lambda after: after is True)
            late = zip(self.records, self.struck, strict=True)
            row["failed_after"] = float(sum(1 for r, after in late if after and not r.ok))
        return row

    def _captured(self, which: Callable[[bool | None], bool]) -> float:
        """Captured reuse of the requests ``which`` selects (by whether sent after the fault)."""
        chosen = zip(self.records, self.cacheable, self.struck, strict=True)
        pairs = [(r, c) for r, c, after in chosen if which(after)]
        cacheable = sum(c for r, c in pairs)
        cached = sum(r.cached_tokens for r, _ in pairs if r.ok)
        return cached / cacheable if cacheable else math.nan


def _share(records: list[RequestRecord]) -> float:
    prompt = sum(r.prompt_tokens for r in records)
    return sum(r.cached_tokens for r in records) / prompt if prompt else math.nan


async def tokenized(chains: list[Chain]) -> list[list[int]]:
    """The prompts' ids as a backend of the same kind renders them, in workload order."""
    port = free_port()
    with backend_process(port, "--cost", "zero"):
        return await workload_tokens(f"http://127.0.0.1:{port}", chains)


def report(name: str, rows: dict[str, dict[str, float]]) -> None:
    print(f"\n### {name}\n")
    print("| setup | failed | TTFT p50 ms | TTFT p90 ms | cached prompt share | captured reuse |")
    print("|---|---:|---:|---:|---:|---:|")
    for setup, row in rows.items():
        extra = failed_after = ""
        if "captured_before" in row:
            before, after = row["captured_before"], row["captured_after"]
            extra = f" (before the fault {before:.1%}, after {after:.1%})"
            failed_after = f", {row['failed_after']:.0f} sent after the fault"
        print(
            f"| {setup} | {row['failed']:.0f} of {row['requests']:.0f}{failed_after} "
            f"| {row['ttft_p50_ms']:.0f} | {row['ttft_p90_ms']:.0f} "
            f"| {row['cached_share']:.1%} | {row['captured_reuse']:.1%}{extra} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=256, help="per run")
    parser.add_argument("--rate", type=float, default=48.0, help="requests/s, Poisson")
    parser.add_argument("--backends", type=int, default=4)
    parser.add_argument("--num-blocks", type=int, default=560, help="KV blocks per backend")
    parser.add_argument("--output-tokens", type=int, default=32, help="the trace's: at most")
    parser.add_argument("--trace", type=Path, default=TRACE, help="a Mooncake-format trace")
    parser.add_argument("--speedup", type=float, default=8.0, help="the trace's clock, faster")
    parser.add_argument("--workload", choices=WORKLOADS, action="append")
    parser.add_argument("--setup", action="append", help="only setups whose name contains this")
    parser.add_argument("--fault", choices=FAULTS, action="append", help="K=3, shared, broken")
    parser.add_argument(
        "--greedy-streams",
        type=int,
        default=0,
        help="then kill an engine under this many greedy streams (torch runner; 0: not run)",
    )
    args = parser.parse_args()
    envoy, why = envoy_binary()
    if envoy is None:
        print(f"no Envoy ({why})")
        return 1
    setups = [s for s in SETUPS if not args.setup or any(f in s.name for f in args.setup)]
    runs = [(s, None) for s in setups]
    runs += [(Setup(f"K=3 shared, {f} killed", 3, shared=True), f) for f in args.fault or ()]
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name in args.workload or WORKLOADS:
        pooled: dict[str, Pooled] = {}
        if name == "trace" and not args.trace.exists():
            print(f"no trace at {args.trace}: the trace workload is left out")
            continue
        num_blocks = TRACE_NUM_BLOCKS if name == "trace" else args.num_blocks
        for number in range(args.rounds):
            chains = workload(name, args, number)
            tokens = asyncio.run(tokenized(chains))
            for setup, fault in runs if number % 2 == 0 else list(reversed(runs)):
                records, struck = one_run(setup, chains, args, envoy, fault, num_blocks)
                pooled.setdefault(setup.name, Pooled()).add(tokens, records, struck)
                single = Pooled()
                single.add(tokens, records, struck)
                row = single.summary()
                print(
                    f"round {number} {name} {setup.name}: failed {row['failed']:.0f}, TTFT p90 "
                    f"{row['ttft_p90_ms']:.0f} ms, cached {row['cached_share']:.1%}, "
                    f"reuse {row['captured_reuse']:.1%}",
                    flush=True,
                )
        rows = {setup: parts.summary() for setup, parts in pooled.items()}
        results[name] = rows
        report(name, rows)
    if args.greedy_streams:
        row = failover(args.greedy_streams, 64, 2048)
        results["engine killed under greedy streams"] = {"torch": row}
        print("\n" + report_failover(row))
    out = ROOT / "build" / "bench-replicas.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
