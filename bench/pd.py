"""`make bench-pd`: prefill/decode disaggregation measured in one run.

Part one (``pd_transfer``): KV transfer throughput between two worker processes on loopback,
beside a raw loopback TCP stream's throughput (the physical floor here), rounds interleaved.

Part two: serving, PD against monolithic on the same cores. Two torch workers (preset
``small``, random weights, one thread each: ``OMP_NUM_THREADS=1``) behind kvgate's gateway
with its embedded picker: either two monolithic workers, or one prefill and one decode worker
in a prefill/decode pool whose picker disaggregates by its decider (uncached prompt ≥ 256
tokens and the prefill worker unsaturated), always, or never (``CONFIGS``). The load tester
sends long random prompts at a low and a high rate (open loop, Poisson); reported per
configuration and load: TTFT and TPOT p50/p99, ITL p99 (vLLM's definitions), output tokens/s,
the share of requests disaggregated, and each ÷ monolithic's. Markdown to stdout, JSON to
``build/bench-pd.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import aiohttp

from bench.pd_transfer import (
    Moved,
    grpc_stream_bytes_per_s,
    into_decode_worker,
    metric_sum,
    prompt_ids,
    raw_socket_bytes_per_s,
    to_bare_client,
)
from loadtest.harness.processes import backend_process, free_port, gateway_process

ROOT = Path(__file__).resolve().parents[1]
MODEL = "kvgate-small"
KEY = "bench-pd"
TORCH = ("--runner", "torch", "--preset", "small", "--kv-cache-memory", "768MiB")
SERVING_KEYS = (
    ("TTFT p50 ms", "median_ttft_ms"),
    ("TTFT p99 ms", "p99_ttft_ms"),
    ("TPOT p50 ms", "median_tpot_ms"),
    ("TPOT p99 ms", "p99_tpot_ms"),
    ("ITL p99 ms", "p99_itl_ms"),
    ("output tok/s", "output_throughput"),
)


def worker(stack: ExitStack, *args: str) -> str:
    port = free_port()
    stack.enter_context(backend_process(port, *TORCH, *args, model=MODEL, runner="torch"))
    return f"http://127.0.0.1:{port}"


def transfer(args: argparse.Namespace) -> dict[str, list[float]]:
    """GB/s per round: raw socket, into a decode worker (float32, float16, float8), bare client."""
    rows: dict[str, list[float]] = {"raw loopback socket": [], "gRPC stream of opaque bytes": [],
                                    "KV into a decode worker": [],
                                    "KV into a decode worker, float16": [],
                                    "KV into a decode worker, float8_e4m3fn": [],
                                    "KV to a bare gRPC client": []}  # fmt: skip
    sizes: list[float] = []
    with ExitStack() as stack:
        prefill = worker(stack, "--role", "prefill")
        decode = worker(stack, "--role", "decode")
        half = worker(stack, "--role", "decode", "--kv-transfer-dtype", "float16")
        fp8 = worker(stack, "--role", "decode", "--kv-transfer-dtype", "float8_e4m3fn")

        async def kv_round(number: int) -> list[Moved]:
            async with aiohttp.ClientSession() as session:
                seeds = range(1000 + 4 * number, 1004 + 4 * number)  # never negative (see random)
                prompts = [prompt_ids(args.transfer_tokens, 250, seed) for seed in seeds]
                moved = [
                    await into_decode_worker(session, prefill, target, MODEL, prompt)
                    for target, prompt in zip((decode, half, fp8), prompts, strict=False)
                ]
                return [*moved, await to_bare_client(session, prefill, MODEL, prompts[3])]

        asyncio.run(kv_round(-1))  # warm-up: channels, first-touched cache pages
        for number in range(args.transfer_rounds):
            moved = asyncio.run(kv_round(number))
            sizes.append(moved[0].num_bytes)
            volume = max(2**28, int(moved[0].num_bytes) * 4)
            rows["raw loopback socket"].append(raw_socket_bytes_per_s(volume) / 1e9)
            rows["gRPC stream of opaque bytes"].append(grpc_stream_bytes_per_s(volume) / 1e9)
            for name, one in zip(list(rows)[2:], moved, strict=True):
                rows[name].append(one.bytes_per_s / 1e9)
            print(
                f"transfer round {number}: "
                + ", ".join(f"{k} {v[-1]:.2f} GB/s" for k, v in rows.items()),
                file=sys.stderr,
            )
    rows["KV bytes per request (MB)"] = [s / 1e6 for s in sizes]
    return rows


# Serving configurations on the same two single-threaded workers: two monolithic ones, or one
# prefill and one decode worker with the picker's decider, or forced either way.
CONFIGS = {
    "monolithic": None,
    "PD decider": "pd: {min_uncached_tokens: 256, max_prefill_in_flight: 1}",
    "PD always disaggregate": "pd: {min_uncached_tokens: 0}",
    "PD always local": "pd: {min_uncached_tokens: 1000000000}",
}
# "always disaggregate" must not fall back while the prefill worker is saturated
NEVER_SATURATED = "epp: {saturation: {queue_depth: 1000000, kv_usage: 1.0, max_metrics_age: 1h}}"


def pd_policy(endpoints: list[str], config: str) -> str:
    key = hashlib.sha256(KEY.encode()).hexdigest()
    addresses = [e.removeprefix("http://") for e in endpoints]
    pd = CONFIGS[config]
    if pd:
        listed = (
            f"[{{address: {addresses[0]}, role: prefill}}, "
            f"{{address: {addresses[1]}, role: decode}}]"
        )
        pool = f"{{{pd}, endpoints: {listed}}}"
    else:
        pool = f"{{endpoints: [{', '.join(addresses)}]}}"
    return f"""
auth: {{api_keys: [{{sha256: {key}, tenant: bench}}]}}
pools: {{p: {pool}}}
routes: [{{model: {MODEL}, pool: p}}]
observability: {{access_log: "off"}}
timeouts: {{first_byte: 300s}}
{NEVER_SATURATED if config == "PD always disaggregate" else ""}
"""


def serve_once(args: argparse.Namespace, config: str, rate: float, out: Path) -> dict[str, float]:
    with ExitStack() as stack:
        pd = CONFIGS[config] is not None
        roles = (("--role", "prefill"), ("--role", "decode")) if pd else ((), ())
        endpoints = [worker(stack, *role, "--max-model-len", "4096") for role in roles]
        policy = out / "policy.yaml"
        policy.write_text(pd_policy(endpoints, config))
        port = free_port()
        stack.enter_context(gateway_process(str(policy), port))
        command = [
            sys.executable, "-m", "kvgate", "loadtest", "--url", f"http://127.0.0.1:{port}",
            "--model", MODEL, "--api-key", KEY, "--endpoint", "completions",
            "--workload", "random", "--input-tokens", str(args.input_tokens),
            "--range-ratio", "0.1", "--chars-per-token", "1",
            "--output-tokens", str(args.output_tokens), "--num-requests", str(args.requests),
            "--rate", str(rate), "--seed", str(args.seed), "--out", str(out),
            "--no-plots", "--no-progress",
        ]  # fmt: skip
        subprocess.run(command, check=True, capture_output=True, timeout=900)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            hops = metric_sum(reply.read().decode(), "kvgate_prefill_hops_total", {"outcome": "ok"})
    result: dict[str, float] = json.loads((out / "results.json").read_text())
    result["disaggregated"] = hops / max(1.0, float(result["completed"]))
    return result


def serving(args: argparse.Namespace) -> dict[str, dict[str, list[dict[str, float]]]]:
    loads = {"low": args.low_rate, "high": args.high_rate}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        load: {name: [] for name in CONFIGS} for load in loads
    }
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-pd-") as tmp:
        for number in range(args.rounds):
            order = list(CONFIGS) if number % 2 == 0 else list(reversed(CONFIGS))
            for load, rate in loads.items():
                for name in order:
                    out = Path(tmp) / f"{number}-{load}-{name.replace(' ', '-')}"
                    out.mkdir()
                    result = serve_once(args, name, rate, out)
                    row = {key: float(result[key]) for _, key in SERVING_KEYS}
                    row["completed"] = float(result["completed"])
                    row["disaggregated"] = result["disaggregated"]
                    runs[load][name].append(row)
                    print(
                        f"round {number} {load} {name}: "
                        + ", ".join(f"{t} {row[k]:.1f}" for t, k in SERVING_KEYS)
                        + f", disaggregated {row['disaggregated']:.0%}",
                        file=sys.stderr,
                    )
    return runs


def report(
    moved: dict[str, list[float]], served: dict[str, dict[str, list[dict[str, float]]]]
) -> None:
    print("\nKV transfer between two processes on loopback (median of rounds)\n")
    print("| path | GB/s | ÷ raw socket |\n|---|---:|---:|")
    raw = statistics.median(moved["raw loopback socket"])
    for name, values in moved.items():
        if name.startswith("KV bytes"):
            continue
        value = statistics.median(values)
        print(f"| {name} | {value:.2f} | {value / raw:.2f} |")
    size = statistics.median(moved["KV bytes per request (MB)"])
    print(f"\nKV per request: {size:.0f} MB (float32 cache)")
    for load, configs in served.items():
        print(f"\nServing at {load} load (median of rounds; ÷ monolithic in brackets)\n")
        print("| config | " + " | ".join(t for t, _ in SERVING_KEYS) + " | disaggregated |")
        print("|---|" + "---:|" * (len(SERVING_KEYS) + 1))
        table = {
            name: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            for name, rows in configs.items()
        }
        base = table["monolithic"]
        for name, row in table.items():
            cells = [
                f"{row[k]:.1f}" + (f" ({row[k] / base[k]:.2f})" if name != "monolithic" else "")
                for _, k in SERVING_KEYS
            ]
            print(f"| {name} | " + " | ".join(cells) + f" | {row['disaggregated']:.0%} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="serving part")
    parser.add_argument("--transfer-rounds", type=int, default=7, help="transfer part")
    parser.add_argument("--transfer-tokens", type=int, default=3000, help="prompt of a transfer")
    parser.add_argument("--input-tokens", type=int, default=1500, help="serving prompts")
    parser.add_argument("--output-tokens", type=int, default=48)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--low-rate", type=float, default=0.3)
    parser.add_argument("--high-rate", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-serving", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per worker
    moved = transfer(args)
    served = {} if args.skip_serving else serving(args)
    report(moved, served)
    out = ROOT / "build" / "bench-pd.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"transfer_gb_per_s": moved, "serving": served}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
