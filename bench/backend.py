"""Benchmark one simulated backend process: `make bench` (or `python -m bench.backend`).

1. Server ceiling: zero-cost model, streamed completions of 16 tokens at rising concurrency;
   requests/s, p50/p99 latency and the backend's CPU time per request.
2. Hosting capacity: the default cost model under a steady load; the CPU share one backend
   uses tells how many such backends a 2-core machine can host before the servers themselves,
   not the cost model, are the bottleneck.
"""

from __future__ import annotations

import argparse

from loadtest.client.http_load import LoadResult, run_load
from loadtest.harness.proc_stats import cpu_seconds
from loadtest.harness.processes import backend_process, free_port


def measure(
    port: int, pid: int, body: dict[str, object], concurrency: int, seconds: float
) -> tuple[LoadResult, float]:
    url = f"http://127.0.0.1:{port}/v1/completions"
    before = cpu_seconds(pid)
    result = run_load(url, body, concurrency, seconds)
    return result, cpu_seconds(pid) - before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="per load level")
    parser.add_argument("--concurrency", default="1,8,32,64,128")
    args = parser.parse_args()
    stream16 = {
        "model": "kvgate-sim",
        "prompt": "Benchmark the backend",
        "max_tokens": 16,
        "stream": True,
    }
    print("## Server ceiling: zero-cost model, streamed completions of 16 tokens\n")
    print(
        "| concurrency | client | requests/s | p50 ms | p99 ms | errors | backend CPU ms/request |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    port = free_port()
    with backend_process(port, "--cost", "zero") as proc:
        assert proc.proc is not None
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            result, cpu = measure(port, proc.proc.pid, stream16, concurrency, args.seconds)
            per_request = cpu / result.requests * 1000 if result.requests else float("nan")
            print(
                f"| {concurrency} | {result.tool} | {result.rps:.0f} | {result.p50_ms:.2f} | "
                f"{result.p99_ms:.2f} | {result.errors} | {per_request:.3f} |"
            )
    print("\n## Hosting capacity: default cost model (a 1-3B model on a small GPU)\n")
    realistic = {"model": "kvgate-sim", "prompt": "word " * 200, "max_tokens": 64, "stream": True}
    port = free_port()
    with backend_process(port) as proc:
        assert proc.proc is not None
        result, cpu = measure(port, proc.proc.pid, realistic, 32, args.seconds)
    share = cpu / result.seconds
    print("| load | requests/s | p50 ms | p99 ms | backend CPU share | backends per 2 cores |")
    print("|---|---:|---:|---:|---:|---:|")
    load = "32 concurrent, one 1,000-token prompt (cached after the first), 64 tokens out"
    print(
        f"| {load} | {result.rps:.1f} | "
        f"{result.p50_ms:.0f} | {result.p99_ms:.0f} | {share:.1%} | {2 / share:.0f} |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
