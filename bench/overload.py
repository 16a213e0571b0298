"""`make bench-overload`: a ramp to twice the fleet's knee with three priority classes, kvgate's
classes (pausing batch streams, deadline-ordered admission) and latency scorer against its own
default and the peers, on the same simulated engines and the same seeded requests.

Traffic: conversations of the ``shared-prefix`` workload and requests of the production trace
(its prompts, at the ramp's rate), each given a class: interactive 20% (32 output tokens),
standard 50% (64), batch 30% (128; its prompts long: a unique 2,400-character document added to
each, and on the trace the longest 30% of the prompts). Each class sends its own API key; a
policy without classes ignores it. Every request is seeded, so an answer's text depends on the
request alone: each batch answer is compared with the same request answered unpaused by an idle
engine. The ramp is ``--knee`` x 0.5, 1, 1.5 and 2, ``--stage-seconds`` each, open loop; one
more run of kvgate's default at a quarter of the knee, 4 stages long, gives the unloaded TTFT.

Rows: kvgate's default (no classes); kvgate with the classes (weights 6/3/1, batch paused at most
twice, interactive requests refused at once when they cannot start within 2 s) and a pool
``max_concurrency`` of ``--slots`` per engine, with and without the ``latency-scorer`` in place
of the token backlog; the latency scorer alone; sglang-router ``cache_aware``; vllm-router
``cache_aware``. Per row: TTFT p50/p99 by class, failed requests by class, goodput (requests
whose TTFT met their class's objective, per second of the ramp), pauses, early refusals, batch
answers that differ from the unpaused ones, the latency model's median and p90 relative error.
Markdown to stdout, JSON to ``build/bench-overload.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
import xxhash

from bench.overload_report import OBJECTIVES, report, row_of
from bench.routing import (
    MODEL,
    TRACE,
    TRACE_REPLAY,
    TRACE_START,
    fresh_backends,
    metrics_text,
    workload,
)
from bench.routing_peers import PEERS, Peer, default_profile_with, peer_bin, running_peer
from loadtest.harness.processes import backend_process, free_port
from loadtest.reports.stage_report import Stage
from loadtest.run.driver import LoadPlan, run_load
from loadtest.workloads.chats import Chain, text
from loadtest.workloads.mooncake import load_trace, trace_chains, window

ROOT = Path(__file__).resolve().parents[1]
CLASSES = (("interactive", 0.2, 32), ("standard", 0.5, 64), ("batch", 0.3, 128))
DOCUMENT_CHARS = 2400  # added to each batch prompt of the shared-prefix workload
NUM_BLOCKS = 2048  # per engine: the batch documents need room
# the engines: the default cost model three times slower, so that the knee is at a rate this
# machine's client and router keep up with
COST = "0.012,0.00015,0.0003,0.0000003"
KEYS = {name: f"sk-bench-{name}" for name, _, _ in CLASSES}
RAMP = (0.5, 1.0, 1.5, 2.0)  # x the knee
# requests/s where TTFT p90 starts to climb on these engines (a ramp of kvgate's default)
KNEES = {"shared-prefix": 12.0, "trace": 20.0}


def traffic(name: str, backends: int, requests: int, seed: int) -> list[Chain]:
    """The workload's requests: ``bench.routing``'s, the trace's window as long as the ramp
    needs."""
    if name != "trace":
        return workload(name, backends, requests, seed)
    replay = replace(TRACE_REPLAY, skip=TRACE_START + seed * requests, limit=requests)
    return trace_chains(window(load_trace(TRACE), replay), replay)


def classed(chains: list[Chain], seed: int, long_prompts: bool) -> list[Chain]:
    """``chains`` with a class each (its key, output length, a seed per request); batch prompts
    made long: the longest 30% of one-request chains (``long_prompts``: the trace), else a
    document added."""
    rng = random.Random(seed)
    batch: set[int] = set()
    if long_prompts:
        by_length = sorted(range(len(chains)), key=lambda i: -len(str(chains[i][0].messages)))
        batch = set(by_length[: round(0.3 * len(chains))])
    out: list[Chain] = []
    for number, chain in enumerate(chains):
        if long_prompts:
            name = (
                "batch" if number in batch else rng.choices(["interactive", "standard"], [2, 5])[0]
            )
        else:
            name = rng.choices([c for c, _, _ in CLASSES], [w for _, w, _ in CLASSES])[0]
        tokens = next(t for c, _, t in CLASSES if c == name)
        document = f"\nDocument {seed}-{number}: " + text(rng, DOCUMENT_CHARS)
        requests = []
        for call, request in enumerate(chain):
            messages = list(request.messages)
            if name == "batch" and not long_prompts:
                last = messages[-1]
                messages[-1] = {**last, "content": str(last["content"]) + document}
            headers = {**request.headers, "Authorization": f"Bearer {KEYS[name]}"}
            fields = {**request.fields, "seed": number * 100 + call}
            requests.append(
                replace(
                    request, messages=messages, headers=headers, group=f"{name}|{request.group}",
                    max_tokens=tokens, at=None, fields=fields,
                )
            )  # fmt: skip
        out.append(requests)
    return out


def _key_entries() -> str:
    return "\n".join(
        f"    - {{sha256: {hashlib.sha256(key.encode()).hexdigest()}, tenant: {name}, "
        f"class: {name}}}"
        for name, key in KEYS.items()
    )


def classes_section() -> str:
    """kvgate's classes: weights 6/3/1, batch paused at most twice, interactive refused when it
    cannot start within 2 s; the API keys that name them."""
    return f"""
classes:
  interactive: {{weight: 6, max_wait: 30s, deadline: 2s}}
  standard: {{weight: 3, max_wait: 120s}}
  batch: {{weight: 1, max_wait: 10m, max_pauses: 2}}
auth:
  api_keys:
{_key_entries()}
"""


def latency_profile() -> str:
    """The default profile with the ``latency-scorer`` in the token backlog's place."""
    return default_profile_with({}, {"token-backlog-scorer": "latency-scorer"})


def peers(slots: int, backends: int) -> list[Peer]:
    limit = f", max_concurrency: {slots * backends}"
    classes = classes_section()
    by_name = {p.name: p for p in PEERS}
    return [
        Peer("kvgate (default)", "kvgate", "default"),
        Peer("kvgate (classes)", "kvgate", "default", pool=limit, extra=classes),
        Peer(
            "kvgate (classes, latency)", "kvgate", "default", pool=limit,
            extra=classes + latency_profile(),
        ),
        Peer("kvgate (latency scorer)", "kvgate", "default", extra=latency_profile()),
        by_name["sglang-router cache_aware"],
        by_name["vllm-router cache_aware"],
    ]  # fmt: skip


async def unpaused_digests(chains: list[Chain]) -> dict[int, str]:
    """Each batch request's answer from an idle engine that never pauses it, by workload
    index."""
    port = free_port()
    flat = [r for chain in chains for r in chain]
    digests: dict[int, str] = {}
    with backend_process(port, "--cost", "zero", "--max-model-len", "32768"):
        async with aiohttp.ClientSession() as session:
            for index, request in enumerate(flat):
                if not request.group.startswith("batch|"):
                    continue
                body = request.body(MODEL, 128)
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                async with session.post(url, json=body) as response:
                    answer = await response.json()
                content = answer["choices"][0]["message"]["content"] or ""
                digests[index] = xxhash.xxh64_hexdigest(content.encode())
    return digests


def one_run(
    peer: Peer, chains: list[Chain], stages: list[Stage], args: argparse.Namespace
) -> dict[str, object]:
    bin_dir, _ = peer_bin()
    with (
        tempfile.TemporaryDirectory() as tmp,
        fresh_backends(args.backends, (), NUM_BLOCKS, cost=COST) as backends,
        running_peer(peer, backends, MODEL, Path(tmp), bin_dir) as (url, _pid, _relays),
    ):
        time.sleep(0.5)
        plan = LoadPlan(url, MODEL, chains, stages, 64, seed=args.seed, request_timeout=900)
        run = asyncio.run(run_load(plan))
        metrics = metrics_text(url) if peer.router == "kvgate" else ""
    return {"records": [r.as_dict() for r in run.records], "metrics": metrics}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", type=int, default=4)
    parser.add_argument("--knee", type=float, help="the fleet's knee, requests/s (per workload)")
    parser.add_argument("--slots", type=int, default=4, help="kvgate's pool slots per engine")
    parser.add_argument("--stage-seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workload", choices=("shared-prefix", "trace"), action="append")
    parser.add_argument("--peer", action="append", help="only rows whose name contains this")
    args = parser.parse_args()
    rows = [
        p
        for p in peers(args.slots, args.backends)
        if not args.peer or any(f in p.name for f in args.peer)
    ]
    if peer_bin()[0] is None:
        rows = [p for p in rows if p.router == "kvgate"]
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for number in range(args.rounds):
        for name in args.workload or ("shared-prefix", "trace"):
            knee = args.knee or KNEES[name]
            stages = [Stage(rate=knee * f, duration=args.stage_seconds) for f in RAMP]
            unloaded = [Stage(rate=knee / 4, duration=args.stage_seconds * 4)]
            requests = math.ceil(sum(s.rate * s.duration for s in stages) * 1.2)
            base = traffic(name, args.backends, requests, number)
            chains = classed(base, number, long_prompts=name == "trace")
            digests = asyncio.run(unpaused_digests(chains))
            idle = one_run(rows[0], chains, unloaded, args)
            floor = row_of(idle, digests, args.stage_seconds * 4)
            order = rows if number % 2 == 0 else list(reversed(rows))
            for peer in order:
                raw = one_run(peer, chains, stages, args)
                row = row_of(raw, digests, args.stage_seconds * len(RAMP), floor)
                results.setdefault(name, {}).setdefault(peer.name, []).append(row)
                print(f"round {number} {name} {peer.name}: {json.dumps(row)}", flush=True)
            results[name].setdefault("unloaded (kvgate default)", []).append(floor)
    report(results, OBJECTIVES)
    out = ROOT / "build" / "bench-overload.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
