"""Speculative decoding (n-gram prompt lookup): kvgate's torch engine with and without drafts,
beside vLLM's CPU build with and without its ``ngram`` speculator — the last step of `make
bench-engine`.

The model is the engine benchmark's (``bench.engine``: a ~5M-parameter random-weight Llama).
Two workloads, 128 output tokens each, ``ignore_eos``:

- ``editing``: each prompt is an edit of a given text (``--document`` token ids, then the
  text's first 20 tokens again, as a model continuing to copy it would see), greedy. A random
  model's greedy text falls into short loops, which prompt lookup predicts;
- ``sampled``: prompts of random tokens, sampled at temperature 1: no loops, and few matches.

The same speculative configuration for both engines: ``{"method": "ngram",
"num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}``. Batch 1 (one
request at a time) and batch 16 (16 in flight), in interleaved rounds after an untimed
warm-up; acceptance from each server's own ``vllm:spec_decode_*`` counters, per workload:
measured, not assumed. Figures go to stdout as Markdown and to
``build/bench-speculation.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench.engine import MODEL_NAME, VOCAB, build_model, start_kvgate, vllm_python
from bench.engine_load import measured_round, run_round
from loadtest.harness.processes import KvgateProcess
from loadtest.harness.vllm import VllmServer

ROOT = Path(__file__).resolve().parents[1]
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}
SPECULATIVE = json.dumps(NGRAM)
BATCHES = {1: 8, 16: 48}  # concurrency: requests per round
WORKLOADS = {"editing": 0.0, "sampled": 1.0}  # name: temperature


def workload_prompts(workload: str, count: int, document: int, seed: int) -> list[list[int]]:
    if workload == "editing":
        return edit_prompts(count, document, seed)
    rng = random.Random(seed)
    return [[rng.randrange(5, VOCAB) for _ in range(document + 20)] for _ in range(count)]


def edit_prompts(count: int, document: int, seed: int) -> list[list[int]]:
    """A text, then its first 20 tokens again (the model is copying it)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        text = [rng.randrange(5, VOCAB) for _ in range(document)]
        prompts.append(text + text[:20])
    return prompts


def spec_counters(url: str) -> dict[str, float]:
    """The server's ``vllm:spec_decode_num_*_total`` counters (0 where it has none)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    totals = dict.fromkeys(("drafts", "draft_tokens", "accepted_tokens"), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix("vllm:spec_decode_num_").removesuffix("_total")
            if name in totals and sample.name.endswith("_total"):
                totals[name] += sample.value
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--document", type=int, default=200, help="tokens of the edited text")
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--pause", type=float, default=2.0)
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args()
    model = build_model()
    servers: dict[str, str] = {}
    kvgates: list[KvgateProcess] = []
    vllms: list[VllmServer] = []
    try:
        for name, extra in (
            ("kvgate", ()),
            ("kvgate+ngram", ("--speculative-config", SPECULATIVE)),
        ):
            kvgates.append(start_kvgate(model, *extra))
            servers[name] = kvgates[-1].health_url.rsplit("/", 1)[0]
        python, why = (None, "--no-vllm") if args.no_vllm else vllm_python()
        if python is None:
            print(f"vLLM peer unavailable: {why}")
        else:
            for name, extra in (
                ("vllm", ()),
                ("vllm+ngram", ("--speculative-config", SPECULATIVE)),
            ):
                log = ROOT / "build" / f"bench-speculation-{name}.log"
                server = VllmServer(
                    python, str(model), name=MODEL_NAME, features=False, log=log, extra=extra
                )
                vllms.append(server.start())
            for server in vllms:
                server.wait_ready()
            servers.update({"vllm": vllms[0].url, "vllm+ngram": vllms[1].url})
        results = measure(servers, args)
    finally:
        for process in kvgates:
            process.stop()
        for server in vllms:
            server.stop()
    report(results)
    out = ROOT / "build" / "bench-speculation.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    return 0


def measure(servers: dict[str, str], args: argparse.Namespace) -> dict[str, object]:
    """Every server's output tokens/s per workload and batch size, in interleaved rounds, and
    the acceptance its counters show over each workload's timed rounds."""
    warm_up = edit_prompts(4, args.document, seed=10_000)
    for url in servers.values():
        asyncio.run(run_round(url, MODEL_NAME, warm_up, args.output_tokens, 4, "warm-up"))
    results: dict[str, object] = {"config": NGRAM}
    for workload, temperature in WORKLOADS.items():
        before = {name: spec_counters(url) for name, url in servers.items()}
        rounds: dict[str, dict[int, list[float]]] = {n: {b: [] for b in BATCHES} for n in servers}
        for number in range(args.rounds):
            for batch, count in BATCHES.items():
                prompts = workload_prompts(workload, count, args.document, number * 100 + batch)
                order = list(servers) if number % 2 == 0 else list(reversed(servers))
                for name in order:
                    result = measured_round(
                        name,
                        servers[name],
                        MODEL_NAME,
                        prompts,
                        args.output_tokens,
                        batch,
                        temperature,
                    )
                    rounds[name][batch].append(result.tokens_per_s)
                    print(
                        f"{workload} round {number} batch {batch} {name}: "
                        f"{result.tokens_per_s:.0f} tok/s"
                    )
                    time.sleep(args.pause)
        results[workload] = {"rounds": rounds, "acceptance": acceptance_since(servers, before)}
    return results


def acceptance_since(
    servers: dict[str, str], before: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    acceptance = {}
    for name, url in servers.items():
        after = spec_counters(url)
        delta = {key: after[key] - before[name][key] for key in after}
        if delta["draft_tokens"]:
            acceptance[name] = {
                **delta,
                "acceptance_rate": delta["accepted_tokens"] / delta["draft_tokens"],
                "mean_accepted_per_draft": delta["accepted_tokens"] / delta["drafts"],
            }
    return acceptance


def report(results: dict[str, object]) -> None:
    for workload in WORKLOADS:
        figures = results[workload]
        assert isinstance(figures, dict)
        rounds = figures["rounds"]
        best = {name: {b: max(v) for b, v in by_batch.items()} for name, by_batch in rounds.items()}
        print(f"\n{workload}:\n\n| engine | batch 1 tok/s | batch 16 tok/s |")
        print("| --- | ---: | ---: |")
        for name, by_batch in best.items():
            print(f"| {name} | {by_batch[1]:.0f} | {by_batch[16]:.0f} |")
        print("\n| speculation's speed-up (best rounds) | batch 1 | batch 16 |")
        print("| --- | ---: | ---: |")
        for engine, drafted in (("kvgate", "kvgate+ngram"), ("vllm", "vllm+ngram")):
            if engine in best and drafted in best:
                gains = [best[drafted][b] / best[engine][b] for b in BATCHES]
                print(f"| {drafted} | {gains[0]:.2f}x | {gains[1]:.2f}x |")
        for name, kept in figures["acceptance"].items():
            print(
                f"{name}: {kept['accepted_tokens']:.0f} of {kept['draft_tokens']:.0f} draft "
                f"tokens kept ({kept['acceptance_rate']:.0%}), "
                f"{kept['mean_accepted_per_draft']:.2f} per draft"
            )


if __name__ == "__main__":
    raise SystemExit(main())
