"""`make bench-fleet`: the picker in front of fleets this machine cannot run, in virtual time
(``bench.fleet_sim``: K replicas of the real picker, N engines of the reference backend's own
scheduler and block manager on its simulated runner's cost model).

Workload: the Mooncake-format production trace's window that ``make bench-routing`` replays (512
requests from its 2,000th, 512-token blocks as 32 tokens, 20x its clock, answers of at most 32
tokens, 4,096 KV blocks per engine), and copies of it scaled ``xS``: S copies, each its own
conversations (a tag before every message: nothing but the chat template's header is shared
between copies), each rotated in time by a random part of the window (its users are not in step
with the others': copies shifted evenly send near-copies of each request within milliseconds,
a herd no real fleet sees), so the rate is S times the trace's; the engines are scaled with it
(``--engines-per-copy``). Replicas take the requests in turn (as
Envoy's round robin) and share their picks ``--share-lag-ms`` after making them (the shared
view's lag, ``python -m bench.shared_view``); precise mode applies KV events after
``--event-lag-ms``.

Per run: TTFT p50/p90/p99 (virtual), captured reuse (cached prompt tokens ÷ what an ideal router
could have served, in the order sent: ``loadtest.workloads.reuse_oracle``), the busiest and
idlest engine's share of the requests (÷ the mean), cold misses (picks that passed over an
endpoint holding more of the prompt, ``kvgate_epp_warm_diverted_total``), and the picker's real
time per pick (parse, hash, score, pick, learn), mean and p99.

``--check``: the simulator against reality at the sizes this machine runs, the same windows:
``bench.routing``'s runs (6 backends, one gateway) and ``bench.replicas``' (6 backends, K = 1 and
3 behind Envoy, sharing through Redis), each beside the simulator's run of the same setup.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.fleet_sim import Arrival, FleetResult, FleetSim
from bench.routing import TRACE, TRACE_NUM_BLOCKS, TRACE_START
from bench.routing_peers import precise_profile
from kvgate.wire.request_tokenizer import ReferenceTokenizer
from loadtest.reports.stats import percentile
from loadtest.run.session import BLOCK
from loadtest.workloads.mooncake import Replay, load_trace, trace_chains, window
from loadtest.workloads.reuse_oracle import cacheable_per_prompt

MAX_MODEL_LEN = 32_768
TOKENIZER = ReferenceTokenizer()


@dataclass(frozen=True)
class FleetRun:
    """One simulated setup."""

    engines: int
    replicas: int
    scale: int = 1
    precise: bool = False
    requests: int = 512  # of the trace's window, before scaling
    speedup: float = 20.0
    output_tokens: int = 32
    num_blocks: int = TRACE_NUM_BLOCKS
    share_lag: float = 0.002
    event_lag: float = 0.002
    seed: int = 0  # which window: the seed-th after ``first``
    trace: Path = TRACE  # a Mooncake-format trace
    first: int = TRACE_START  # its first request replayed
    sample: int | None = None  # epp.sample_candidates (None: the default)
    scrape_interval: float | None = None  # epp.scrape_interval, seconds (None: the default)


def epp_section(run: FleetRun) -> str:
    """The policy's ``epp:`` section: the default profile or the shipped precise one, with the
    run's ``sample_candidates``."""
    epp: dict[str, object] = json.loads(precise_profile()[5:]) if run.precise else {}
    if run.sample is not None:
        epp["sample_candidates"] = run.sample
    if run.scrape_interval is not None:
        epp["scrape_interval"] = f"{run.scrape_interval}s"
    return "epp: " + json.dumps(epp) if epp else ""


def _tagged(messages: list[dict[str, Any]], copy: int) -> list[dict[str, Any]]:
    if not copy:
        return messages
    return [{**m, "content": f"[{copy}] {m['content']}"} for m in messages]


def arrivals(run: FleetRun) -> list[Arrival]:
    """The trace's window and its copies, in order of arrival."""
    replay = Replay(32, 1 / run.speedup, max_output=run.output_tokens)
    replay = replace(replay, skip=run.first + run.seed * run.requests, limit=run.requests)
    chains = trace_chains(window(load_trace(run.trace), replay), replay)
    base = [chain[0] for chain in chains]
    times = [r.at or 0.0 for r in base]
    span = times[-1] - times[0] + (times[-1] - times[0]) / max(1, len(base) - 1)
    rng = random.Random(run.seed)
    items = []
    for copy in range(run.scale):
        rotation = rng.uniform(0, span) if copy else 0.0  # its own users: not in step with others
        for request, at in zip(base, times, strict=True):
            messages = _tagged(request.messages, copy)
            items.append(
                Arrival(
                    times[0] + (at - times[0] + rotation) % span,
                    messages,
                    request.max_tokens or run.output_tokens,
                    lambda m=messages: TOKENIZER.chat_ids(m),  # type: ignore[misc]
                )
            )
    items.sort(key=lambda a: a.at)
    return items


@dataclass
class Outcome:
    """One simulated run: what happened, what an ideal router could have cached of each
    request (in order of arrival), and the real seconds it took."""

    result: FleetResult
    cacheable: list[int]
    wall: float


def simulate(run: FleetRun) -> Outcome:
    items = arrivals(run)
    sim = FleetSim(
        run.engines,
        run.replicas,
        num_blocks=run.num_blocks,
        max_model_len=MAX_MODEL_LEN,
        precise=run.precise,
        epp=epp_section(run),
        share_lag=run.share_lag,
        event_lag=run.event_lag,
    )
    started = time.perf_counter()
    result = sim.run(items)
    wall = time.perf_counter() - started
    return Outcome(result, cacheable_per_prompt((a.token_ids() for a in items), BLOCK), wall)


def row(outcomes: list[Outcome]) -> dict[str, float]:
    """The runs' figures, pooled."""
    ttfts = [t * 1000 for o in outcomes for t in o.result.ttft]
    picks = [s * 1e6 for o in outcomes for s in o.result.pick_seconds]
    served = [n for o in outcomes for n in o.result.served]
    mean = statistics.fmean(served)
    cacheable = sum(sum(o.cacheable) for o in outcomes)
    cached = sum(sum(o.result.cached) for o in outcomes)
    return {
        "requests": float(len(ttfts)),
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p90_ms": percentile(ttfts, 90),
        "ttft_p99_ms": percentile(ttfts, 99),
        "captured_reuse": cached / cacheable if cacheable else math.nan,
        "max_share": max(served) / mean,
        "min_share": min(served) / mean,
        "cold_misses": sum(o.result.warm_diverted for o in outcomes) / len(ttfts),
        "pick_us_mean": statistics.fmean(picks),
        "pick_us_p99": percentile(picks, 99),
        "wall_s": sum(o.wall for o in outcomes),
    }


HEADER = (
    "| setup | engines | replicas | requests | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms "
    "| captured reuse | min / max share | cold misses | pick µs mean | pick µs p99 | wall s |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"
)


def line(name: str, run: FleetRun, r: dict[str, float]) -> str:
    return (
        f"| {name} | {run.engines:,} | {run.replicas} | {r['requests']:,.0f} "
        f"| {r['ttft_p50_ms']:.0f} | {r['ttft_p90_ms']:.0f} | {r['ttft_p99_ms']:.0f} "
        f"| {r['captured_reuse']:.1%} | {r['min_share']:.2f} / {r['max_share']:.2f} "
        f"| {r['cold_misses']:.1%} | {r['pick_us_mean']:.0f} | {r['pick_us_p99']:.0f} "
        f"| {r['wall_s']:.0f} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=int, action="append", help="copies of the trace: 1 10 100")
    parser.add_argument("--engines-per-copy", type=int, default=10)
    parser.add_argument("--replicas", type=int, action="append", help="K: 1 16")
    parser.add_argument("--precise", action="store_true", help="precise mode (KV events)")
    parser.add_argument("--share-lag-ms", type=float, default=2.0)
    parser.add_argument("--event-lag-ms", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0, help="which window of the trace")
    parser.add_argument("--sample", type=int, action="append", help="epp.sample_candidates")
    parser.add_argument("--scrape-ms", type=float, help="epp.scrape_interval (default 50)")
    parser.add_argument("--check", action="store_true", help="against bench-routing/replicas")
    parser.add_argument("--rounds", type=int, default=2, help="--check: windows compared")
    args = parser.parse_args()
    if args.check:
        from bench.fleet_check import check

        return check(args.rounds)
    mode = "precise" if args.precise else "approximate"
    print(f"## Simulated fleets ({mode}; the trace's window x scale)\n\n{HEADER}")
    for scale in args.scale or [1, 10, 100]:
        baseline = None
        for sample in args.sample or [None]:
            for replicas in args.replicas or [1, 16]:
                run = FleetRun(
                    args.engines_per_copy * scale,
                    replicas,
                    scale,
                    args.precise,
                    share_lag=args.share_lag_ms / 1000,
                    event_lag=args.event_lag_ms / 1000,
                    seed=args.seed,
                    sample=sample,
                    scrape_interval=None if args.scrape_ms is None else args.scrape_ms / 1000,
                )
                result = row([simulate(run)])
                baseline = baseline or result
                versus = result["ttft_p90_ms"] / baseline["ttft_p90_ms"]
                name = f"x{scale}, K={replicas}" + ("" if sample is None else f", sample {sample}")
                print(line(f"{name} (p90 {versus:.2f}x first)", run, result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
