"""One load test from options to files: build the workload, read the backends' counters,
send it, compute the metrics, write ``results.json`` (``vllm bench serve``'s keys),
``stages.json`` and the plots, and print the summary."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from loadtest.client.backend_metrics import deltas, scrape_all
from loadtest.client.tokenize import in_order, prompt_tokens
from loadtest.reports import plots
from loadtest.reports.by_call import ttft_by_call
from loadtest.reports.records import RequestRecord
from loadtest.reports.results_file import (
    label_of,
    read_results,
    results_document,
    write_results,
)
from loadtest.reports.serving_metrics import benchmark_result, errors_by_kind
from loadtest.reports.stage_report import stage_report
from loadtest.reports.table import comparison, run_summary
from loadtest.run.driver import LoadPlan, LoadRun, run_load
from loadtest.run.plan_options import (
    build_workload,
    default_count,
    slos_of,
    stages_of,
    trace_window,
)
from loadtest.workloads.chats import Chain
from loadtest.workloads.mooncake import ideal_reuse
from loadtest.workloads.reuse_oracle import cacheable_tokens

BLOCK = 16  # the block size the oracle counts in (vLLM's and the reference backend's default)


async def workload_tokens(url: str, chains: list[Chain]) -> list[list[int]]:
    """Every request's prompt ids as the server at ``url`` tokenizes them, in workload order."""
    return in_order(chains, await prompt_tokens(url, chains))


def sent_prompts(tokens: list[list[int]], records: list[RequestRecord]) -> list[list[int]]:
    """The prompt ids of the requests that were sent, in the order they were sent."""
    sent = sorted((r for r in records if r.index >= 0), key=lambda r: r.start)
    return [tokens[r.index] for r in sent]


def oracle_of(tokens: list[list[int]], records: list[RequestRecord]) -> int:
    """What an ideal router could have served from cache of the requests that were sent, in
    the order they were sent."""
    return cacheable_tokens(sent_prompts(tokens, records), BLOCK)


async def measured(plan: LoadPlan, backends: list[str], progress: bool) -> tuple[LoadRun, Any]:
    before = await scrape_all(backends)
    with tqdm(
        total=plan.planned_requests, unit="req", disable=not progress, file=sys.stderr
    ) as bar:

        def advance() -> None:
            bar.update(1)

        run = await run_load(plan, advance)
    after = await scrape_all(backends)
    return run, deltas(before, after, backends) if backends else None


def document_for(
    plan: LoadPlan,
    run: LoadRun,
    counters: Any,
    oracle: int | None,
    *,
    label: str,
    workload: str,
    slos: dict[str, float] | None = None,
) -> dict[str, object]:
    """The results document of one run (``counters``: the backends' deltas, or None)."""
    records = run.records
    ok = [r for r in records if r.ok]
    cached = sum(r.cached_tokens for r in ok)
    prompt = sum(r.prompt_tokens for r in ok)
    extras: dict[str, object] = {
        "url": plan.url,
        "workload": workload,
        "seed": plan.seed,
        "stages": stage_report(records, plan.stages, run.stage_seconds),
        "ttft_by_call": ttft_by_call(records),
        "errors_by_kind": errors_by_kind(records),
        "cached_tokens": cached,
        "cached_prompt_share": cached / prompt if prompt else None,
        "oracle_cacheable_tokens": oracle,
        "captured_reuse": cached / oracle if oracle else None,
        "backends": counters,
        "prefix_cache_hit_rate": counters["prefix_cache_hit_rate"] if counters else None,
        "preemptions": counters["preemptions"] if counters else None,
        "load_spread": counters["load_spread"] if counters else None,
        "records": [r.as_dict() for r in records],
    }
    first = plan.stages[0]
    return results_document(
        label=label,
        model=plan.model,
        endpoint=plan.endpoint,
        rate=first.rate if first.rate and len(plan.stages) == 1 else None,
        concurrency=first.concurrency or None,
        benchmark=benchmark_result(records, run.duration, slos),
        extras=extras,
    )


def write_outputs(document: dict[str, object], out: Path, with_plots: bool) -> list[Path]:
    write_results(document, out / "results.json")
    extras = document["kvgate"]
    assert isinstance(extras, dict)
    write_results({"stages": extras["stages"]}, out / "stages.json")
    written = [out / "results.json", out / "stages.json"]
    if with_plots:
        if plots.available():
            written += plots.plot_results({str(document["label"]): document}, out, "run")
        else:
            print("plots skipped: matplotlib is not installed (pip install 'kvgate[loadtest]')")
    return written


def run_loadtest(args: argparse.Namespace) -> int:
    if args.compare:
        return compare(args.compare, args.out, not args.no_plots)
    if not args.url:
        print("kvgate loadtest: --url is required (or --compare FILES)", file=sys.stderr)
        return 2
    try:
        stages = stages_of(args)
        count = default_count(args, stages)
        chains = build_workload(args, count)
        if args.workload == "trace" and args.num_requests is None:
            count = len(chains)  # the whole window
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        plan = LoadPlan(
            url=args.url,
            model=args.model,
            chains=chains,
            stages=stages,
            output_tokens=args.output_tokens,
            endpoint=args.endpoint,
            max_requests=count,
            max_seconds=args.duration,
            request_timeout=args.request_timeout,
            headers=headers,
            seed=args.seed,
        )
        slos = slos_of(args)
    except ValueError as exc:
        print(f"kvgate loadtest: {exc}", file=sys.stderr)
        return 2
    tokens = asyncio.run(workload_tokens(args.tokenize_url, chains)) if args.tokenize_url else None
    run, counters = asyncio.run(measured(plan, args.backend_metrics, not args.no_progress))
    oracle = oracle_of(tokens, run.records) if tokens is not None else None
    document = document_for(
        plan,
        run,
        counters,
        oracle,
        label=args.label or args.workload,
        workload=args.workload,
        slos=slos,
    )
    if args.workload == "trace":  # what an infinite cache could have served of what was sent
        replayed = trace_window(args)
        sent = sorted((r for r in run.records if r.index >= 0), key=lambda r: r.start)
        extras = document["kvgate"]
        assert isinstance(extras, dict)
        extras["trace_ideal_reuse"] = ideal_reuse(replayed[r.index] for r in sent)
    print(run_summary(document))
    for path in write_outputs(document, args.out, not args.no_plots):
        print(f"wrote {path}")
    return 0 if document["completed"] else 1


def compare(paths: list[Path], out: Path, with_plots: bool) -> int:
    try:
        documents = [read_results(p) for p in paths]
    except ValueError as exc:
        print(f"kvgate loadtest --compare: {exc}", file=sys.stderr)
        return 2
    labels = [label_of(d, p) for d, p in zip(documents, paths, strict=True)]
    if len(set(labels)) < len(labels):
        labels = [f"{label} ({p.name})" for label, p in zip(labels, paths, strict=True)]
    print(comparison(documents, labels))
    if with_plots and plots.available():
        named = dict(zip(labels, documents, strict=True))
        for path in plots.plot_results(named, out, "compare"):
            print(f"wrote {path}")
    return 0
