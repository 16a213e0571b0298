"""`make bench-engine`: kvgate's torch engine against vLLM's CPU build and HF transformers.

One model (a ~5M-parameter random-weight Llama with a locally trained tokenizer, built by
``tests/vllm/tiny_model.py --shape bench``), one workload: ``--requests`` token-id prompts of
32-512 tokens, 64 output tokens each (``ignore_eos``), greedy, concurrency 16. Side by side in
the same run, after one untimed warm-up round each (same size), in interleaved rounds
(kvgate, vLLM, vLLM, kvgate, ...) with a quiet pause after each:

- kvgate's engine through its OpenAI server (``kvgate backend --runner torch``);
- vLLM's CPU build on the same folder (its own venv, made by ``tests/vllm/prepare.sh``);

and in each round, each in a process of its own, HF ``generate`` one request at a time and in
static batches of 8 and HF's continuous batching (``generate_batch``); then a bare matmul loop (the
physical limit), and the same workload computed by the least eager torch can do (the
plain-torch ceiling, ``bench.torch_floor``). Then TTFT over a shared 1,024-token
prefix, cold against cached, on both servers, and kvgate's RSS over ``--rss-requests`` short
requests. Figures go to stdout as Markdown and to ``build/bench-engine.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench.engine_load import make_prompts, measured_round, run_round, shared_prefix_ttft
from bench.engine_report import report
from loadtest.harness.proc_stats import rss_mb
from loadtest.harness.processes import KvgateProcess, backend_process, free_port
from loadtest.harness.vllm import VllmServer

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("KVGATE_CACHE", Path.home() / ".cache" / "kvgate"))
MODEL_NAME = "bench-llama"
VOCAB = 1024


def build_model() -> Path:
    folder = CACHE / "bench-llama" / "model"
    if not (folder / "kvgate-built.json").is_file():
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "tests/vllm/tiny_model.py"),
                str(folder),
                "--shape",
                "bench",
            ],
            check=True,
            capture_output=True,
        )
    return folder


def vllm_python() -> tuple[str | None, str]:
    """The vLLM venv's Python, or None and why it is unavailable."""
    out = subprocess.run(
        ["bash", str(ROOT / "tests/vllm/prepare.sh")], capture_output=True, text=True, check=False
    ).stdout
    paths = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    unavailable = Path(paths.get("KVGATE_VLLM_UNAVAILABLE", "/nonexistent"))
    if unavailable.is_file():
        return None, unavailable.read_text().strip()
    return paths.get("KVGATE_VLLM_PYTHON"), ""


def child_json(args: list[str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def start_kvgate(model: Path, *extra: str) -> KvgateProcess:
    args: tuple[str, ...] = (
        "--model-path",
        str(model),
        "--max-model-len",
        "2048",
        "--kv-cache-memory",
        "1GiB",
        *extra,
    )
    proc = backend_process(free_port(), *args, model=MODEL_NAME, runner="torch")
    return proc.start(timeout=120)


HF_MODES = ("sequential", "static8", "continuous")


def hf_round(
    model: Path, prompts: list[list[int]], output_tokens: int
) -> dict[str, dict[str, float]]:
    """One round of each HF transformers peer on ``prompts``, each in a process of its own."""
    prompts_file = ROOT / "build" / "bench-engine-round-prompts.json"
    prompts_file.parent.mkdir(exist_ok=True)
    prompts_file.write_text(json.dumps(prompts))
    return {
        f"hf_{mode}": child_json(
            ["bench.hf_peers", str(model), mode, str(prompts_file), str(output_tokens)]
        )
        for mode in HF_MODES
    }


def rss_over_requests(url: str, pid: int, total: int) -> list[tuple[int, float]]:
    """kvgate's RSS after each tenth of ``total`` short requests."""
    points = []
    prompts = make_prompts(total, 16, 48, VOCAB, seed=99)
    step = max(total // 10, 1)
    for start in range(0, total, step):
        asyncio.run(run_round(url, MODEL_NAME, prompts[start : start + step], 4, 16, "rss"))
        points.append((start + step, rss_mb(pid)))
    return points


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per engine")
    parser.add_argument(
        "--pause",
        type=float,
        default=3.0,
        help="seconds of quiet after each engine's round (vLLM keeps a core busy for about a "
        "second after its last request)",
    )
    parser.add_argument("--rss-requests", type=int, default=10_000)
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--no-hf", action="store_true")
    parser.add_argument(
        "--engine-process",
        action="store_true",
        help="also run kvgate with --engine-process (the model in a child process)",
    )
    parser.add_argument(
        "--plain-matmul",
        action="store_true",
        help="also run kvgate with --plain-matmul (projections without oneDNN's packed weights)",
    )
    args = parser.parse_args()
    model = build_model()
    results: dict[str, object] = {"machine": os.uname().nodename, "cpus": os.cpu_count()}
    servers: dict[str, str] = {}
    kvgate = start_kvgate(model)
    assert kvgate.proc is not None
    servers["kvgate"] = kvgate.health_url.rsplit("/", 1)[0]
    variants: dict[str, KvgateProcess] = {}  # kvgate started with other flags, by name
    for name, wanted, flag in (
        ("kvgate-process", args.engine_process, "--engine-process"),
        ("kvgate-plain", args.plain_matmul, "--plain-matmul"),
    ):
        if wanted:
            variants[name] = start_kvgate(model, flag)
            servers[name] = variants[name].health_url.rsplit("/", 1)[0]
    vllm: VllmServer | None = None
    if not args.no_vllm:
        python, why = vllm_python()
        if python is None:
            print(f"vLLM peer unavailable: {why}")
        else:
            vllm = VllmServer(
                python,
                str(model),
                name=MODEL_NAME,
                features=False,
                log=ROOT / "build" / "bench-engine-vllm.log",
            )
            (ROOT / "build").mkdir(exist_ok=True)
            vllm.start().wait_ready()
            servers["vllm"] = vllm.url
    try:
        warm_up = make_prompts(args.requests, 32, 512, VOCAB, seed=10_000)
        for url in servers.values():  # untimed: first-call costs, and peers' start-up work
            asyncio.run(
                run_round(url, MODEL_NAME, warm_up, args.output_tokens, args.concurrency, "warm-up")
            )
            time.sleep(args.pause)
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
        for number in range(args.rounds):
            prompts = make_prompts(args.requests, 32, 512, VOCAB, seed=number)
            order = list(servers) if number % 2 == 0 else list(reversed(servers))
            for name in order:
                result = measured_round(
                    name, servers[name], MODEL_NAME, prompts, args.output_tokens, args.concurrency
                )
                rounds[name].append(
                    {
                        "tokens_per_s": result.tokens_per_s,
                        "ttft_p50_ms": result.ttft_p50_ms,
                        "seconds": result.seconds,
                        "output_tokens": result.output_tokens,
                    }
                )
                print(
                    f"round {number} {name}: {result.tokens_per_s:.0f} output tok/s, "
                    f"TTFT p50 {result.ttft_p50_ms:.0f} ms",
                    flush=True,
                )
                time.sleep(args.pause)
            if not args.no_hf:
                for name, value in hf_round(model, prompts, args.output_tokens).items():
                    rounds.setdefault(name, []).append(value)
                    print(f"round {number} {name}: {value['tokens_per_s']:.0f} output tok/s")
                    time.sleep(args.pause)
        results["rounds"] = rounds
        prefix = make_prompts(1, 1024, 1024, VOCAB, seed=7)[0]
        suffixes = make_prompts(9, 16, 16, VOCAB, seed=8)
        shared = {}
        for name, url in servers.items():
            cold, warm = asyncio.run(
                shared_prefix_ttft(url, MODEL_NAME, prefix, suffixes, uuid.uuid4().hex)
            )
            shared[name] = {"cold_ms": cold * 1000, "warm_ms": sorted(warm)[len(warm) // 2] * 1000}
            print(
                f"shared 1,024-token prefix, {name}: cold {cold * 1000:.0f} ms, "
                f"cached {shared[name]['warm_ms']:.0f} ms",
                flush=True,
            )
        results["shared_prefix"] = shared
        if vllm is not None:
            vllm.stop()
            vllm = None
        for variant in variants.values():
            variant.stop()
        if args.rss_requests:
            points = rss_over_requests(servers["kvgate"], kvgate.proc.pid, args.rss_requests)
            results["kvgate_rss_mb"] = points
            print("kvgate RSS (requests, MiB):", ", ".join(f"{n}: {m:.0f}" for n, m in points))
    finally:
        kvgate.stop()
        for variant in variants.values():
            variant.stop()
        if vllm is not None:
            vllm.stop()
    prompts_file = ROOT / "build" / "bench-engine-prompts.json"  # round 0's, for the ceiling
    prompts_file.parent.mkdir(exist_ok=True)
    prompts_file.write_text(json.dumps(make_prompts(args.requests, 32, 512, VOCAB, seed=0)))
    results["matmul_floor"] = child_json(["bench.matmul_floor", "256", "768"])
    results["torch_floor"] = child_json(
        ["bench.torch_floor", str(model), str(prompts_file), str(args.output_tokens)]
    )
    report(results)
    out = ROOT / "build" / "bench-engine.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
