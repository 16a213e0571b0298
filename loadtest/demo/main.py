"""``kvgate demo``: N fresh backends behind the gateway, one seeded workload run twice — once
routed by load only (the gateway's least-in-flight picker: the baseline) and once by kvgate's
KV-cache-aware endpoint picker — then one comparison table, a verdict, plots, and everything
stopped.

The workload is the one KV-aware routing exists for: more long system prompts than backends
(16 over 4 by default, filling about 70% of their caches together), each asked many short
questions, in a shuffled order, arriving faster than the backends can prefill every prompt
from scratch (the simulated backend charges 50 µs per uncached prompt token). A router that
keeps each prompt where it is cached prefills it once; one that spreads requests by load
prefills it again and again, and those misses queue.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import sys
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from loadtest.demo.stack import DemoOptions, running_stack
from loadtest.reports import plots
from loadtest.reports.stage_report import Stage
from loadtest.reports.table import comparison
from loadtest.run.driver import LoadPlan
from loadtest.run.session import document_for, measured, oracle_of, workload_tokens, write_outputs
from loadtest.workloads.chats import Chain, shared_prefix

MODEL = "kvgate-sim"
T = TypeVar("T")
RUNS = (("baseline (least-in-flight)", "least-in-flight"), ("kvgate (KV-aware EPP)", "epp"))
LEGEND = """\
TTFT: time to first token; TPOT: time per output token after it; E2EL: the whole request.
cached prompt share: prompt tokens the backends served from their KV cache.
captured reuse: cached tokens as a share of what an ideal router (one that knew every cache
  and never evicted) could have served from cache. backend hit rate: the backends' own
  vllm:prefix_cache_hits / queries. max ÷ mean load: the busiest backend's requests ÷ the mean."""


def verdict(baseline: dict[str, object], kvgate: dict[str, object]) -> str:
    def value(doc: dict[str, object], key: str) -> float:
        raw = doc.get(key)
        extras = doc.get("kvgate")
        if raw is None and isinstance(extras, dict):
            raw = extras.get(key)
        return float(raw) if isinstance(raw, int | float) else math.nan

    base_p90, ours_p90 = value(baseline, "p90_ttft_ms"), value(kvgate, "p90_ttft_ms")
    base_hit = value(baseline, "prefix_cache_hit_rate")
    ours_hit = value(kvgate, "prefix_cache_hit_rate")
    if not (base_p90 > 0 and ours_p90 > 0):
        return "verdict: no comparison (a run had no successful requests)"
    ratio = base_p90 / ours_p90
    throughput = value(kvgate, "output_throughput") / value(baseline, "output_throughput")
    hits = f"prefix-cache hit rate {ours_hit:.0%} vs {base_hit:.0%}"
    if ratio >= 1.1:
        return (
            f"verdict: KV-aware routing cut TTFT p90 {ratio:.1f}x ({ours_p90:.0f} ms vs "
            f"{base_p90:.0f} ms), {hits}, output throughput {throughput:.2f}x"
        )
    return (
        f"verdict: no clear gain on this run (TTFT p90 {ours_p90:.0f} ms vs "
        f"{base_p90:.0f} ms), {hits}: the machine may be too loaded to tell"
    )


class Terminated(Exception):
    """SIGTERM arrived: unwind, stopping every process on the way out."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` with SIGTERM cancelling the work (the sync handler could not raise into
    the loop's tasks without leaving them half done), raised afterwards as ``Terminated``."""

    async def guarded() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            return await coroutine
        except asyncio.CancelledError:
            raise Terminated from None
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    try:
        return asyncio.run(guarded())
    finally:
        signal.signal(signal.SIGTERM, _on_sigterm)


def one_run(
    options: DemoOptions,
    args: argparse.Namespace,
    label: str,
    picker: str,
    chains: list[Chain],
    tokens: list[list[int]] | None,
) -> tuple[dict[str, object], list[list[int]]]:
    """One policy on fresh backends; ``tokens``: the prompts' ids (fetched if None)."""
    with running_stack(options, picker, MODEL) as (gateway, backends):
        if tokens is None:
            tokens = run_async(workload_tokens(backends[0], chains))
        plan = LoadPlan(
            url=gateway,
            model=MODEL,
            chains=chains,
            stages=[Stage(rate=args.rate)],
            output_tokens=args.output_tokens,
            max_requests=args.requests,
            seed=args.seed,
        )
        print(
            f"{label}: {args.requests} requests at {args.rate:g}/s through {gateway} "
            f"to {len(backends)} fresh backends",
            flush=True,
        )
        run, counters = run_async(measured(plan, backends, sys.stderr.isatty()))
    oracle = oracle_of(tokens, run.records)
    document = document_for(plan, run, counters, oracle, label=label, workload="shared-prefix")
    return document, tokens


def run_demo(args: argparse.Namespace) -> int:
    per_group = math.ceil(args.requests / args.groups)
    chains = shared_prefix(args.groups, per_group, args.prefix_tokens, args.seed)[: args.requests]
    documents: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="kvgate-demo-") as workdir:
        options = DemoOptions(args.backends, args.runner, args.num_blocks, Path(workdir))
        tokens: list[list[int]] | None = None
        for label, picker in RUNS:
            document, tokens = one_run(options, args, label, picker, chains, tokens)
            documents[label] = document
            write_outputs(document, args.out / picker, with_plots=False)
    print()
    print(comparison(list(documents.values()), list(documents)))
    print()
    print(LEGEND)
    print()
    baseline, kvgate = documents.values()
    print(verdict(baseline, kvgate))
    if plots.available():
        for path in plots.plot_results(documents, args.out, "demo"):
            print(f"wrote {path}")
    print(f"results: {args.out}/*/results.json (vllm bench serve's keys)")
    failed = sum(int(d["failed"]) for d in documents.values())  # type: ignore[call-overload]
    return 0 if failed == 0 else 1


def main(args: argparse.Namespace) -> int:
    """The demo; on Ctrl-C or SIGTERM every process it started is stopped, without a trace."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return run_demo(args)
    except KeyboardInterrupt:
        print("\ndemo interrupted: every process it started is stopped", file=sys.stderr)
        return 130
    except Terminated:
        print("\ndemo terminated: every process it started is stopped", file=sys.stderr)
        return 128 + signal.SIGTERM
    except RuntimeError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
