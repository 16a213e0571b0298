"""An engine killed while ``--streams`` greedy streams run on it (``make bench-replicas``'s engine
fault on real models): do the streams end cleanly at the client, and does every joined answer
equal the uninterrupted one, token for token?

Two torch backends (random-weight ``tiny`` Llama, seed 0: the same model on both) behind one
gateway whose picker keeps a shared prefix on the endpoint that holds it (prefix scorer only,
so every stream lands on one engine). Each run sends ``--streams`` streamed chat requests at
once (one system prompt, a question each; temperature 0, ``ignore_eos``, ``--tokens`` tokens):
first uninterrupted, then again on fresh backends with the engine serving them SIGKILLed once
the streams are about half way. Reported: streams that ended in an error, joined answers equal
to the uninterrupted ones, and the gateway's resumes (``kvgate_stream_resumes_total``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import aiohttp

from bench.pd_transfer import metric_sum
from loadtest.client.sse import StreamResult, stream_request
from loadtest.harness.processes import KvgateProcess, backend_process, free_port, gateway_process

MODEL = "kvgate-tiny"
SYSTEM = "You are the parcel company's assistant; answer every question in full sentences. " * 4
PICKER = (
    "epp: {plugins: [{name: prefix, type: prefix-cache-scorer}, {name: pick, type: "
    "max-score-picker}], profiles: [{name: default, plugins: [{ref: prefix}, {ref: pick}]}]}"
)


@contextmanager
def torch_stack(workdir: Path, num_blocks: int) -> Iterator[tuple[str, list[KvgateProcess]]]:
    """Two fresh torch backends and a gateway in front; yields its URL and the backends."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ports = [free_port(), free_port()]
    args = ("--preset", "tiny", "--seed", "0", "--num-blocks", str(num_blocks))
    with ExitStack() as stack:
        engines = [
            stack.enter_context(
                backend_process(
                    p, *args, model=MODEL, runner="torch", log=str(workdir / f"b{p}.log")
                )
            )
            for p in ports
        ]
        policy = workdir / "policy.yaml"
        endpoints = ", ".join(f"127.0.0.1:{p}" for p in ports)
        policy.write_text(
            f"pools: {{p: {{endpoints: [{endpoints}]}}}}\nroutes: [{{model: {MODEL}, pool: p}}]\n"
            f"timeouts: {{first_byte: 120s}}\n{PICKER}\n"
        )
        port = free_port()
        stack.enter_context(gateway_process(str(policy), port, log=str(workdir / "gateway.log")))
        yield f"http://127.0.0.1:{port}", engines


async def _streams(url: str, count: int, tokens: int) -> list[StreamResult]:
    bodies = [
        {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"question {n}: where is my parcel number {n * 7919}?"},
            ],
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,  # the answers are compared token for token
        }
        for n in range(count)
    ]
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return await asyncio.gather(
            *(stream_request(session, f"{url}/v1/chat/completions", b) for b in bodies)
        )


def _busiest(engines: list[KvgateProcess]) -> KvgateProcess:
    """The engine with the most requests running (its /metrics)."""

    def running(engine: KvgateProcess) -> float:
        port = engine.args[engine.args.index("--port") + 1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return metric_sum(response.read().decode(), "vllm:num_requests_running", {})

    return max(engines, key=running)


def failover(streams: int, tokens: int, num_blocks: int) -> dict[str, float]:
    """One uninterrupted run and one with the serving engine killed half way (by the first
    run's length); their comparison."""
    with tempfile.TemporaryDirectory() as tmp, torch_stack(Path(tmp), num_blocks) as (url, _):
        began = time.perf_counter()
        reference = asyncio.run(_streams(url, streams, tokens))
        length = time.perf_counter() - began
    with tempfile.TemporaryDirectory() as tmp, torch_stack(Path(tmp), num_blocks) as stack:
        url, engines = stack
        killed: list[KvgateProcess] = []

        def kill() -> None:
            killed.append(_busiest(engines))
            killed[0].kill()

        timer = threading.Timer(length / 2, kill)
        timer.start()
        try:
            broken = asyncio.run(_streams(url, streams, tokens))
        finally:
            timer.cancel()
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            metrics = response.read().decode()
    errors = sum(1 for r in broken if r.error or not r.done)
    equal = sum(
        1
        for a, b in zip(reference, broken, strict=True)
        if a.done and len(a.token_ids) == tokens and a.token_ids == b.token_ids
    )
    return {
        "streams": float(streams),
        "errors": float(errors),
        "equal": float(equal),
        "reference_errors": float(sum(1 for r in reference if r.error or not r.done)),
        "killed_at_s": length / 2 if killed else -1.0,
        "resumed": metric_sum(metrics, "kvgate_stream_resumes_total", {"outcome": "resumed"}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--num-blocks", type=int, default=2048)
    args = parser.parse_args()
    row = failover(args.streams, args.tokens, args.num_blocks)
    print(report(row))
    return 0 if row["errors"] == 0 and row["equal"] == row["streams"] else 1


def report(row: dict[str, float]) -> str:
    return (
        f"engine killed at {row['killed_at_s']:.1f} s with {row['streams']:.0f} greedy streams "
        f"on it: {row['errors']:.0f} ended in an error at the client, {row['equal']:.0f} of "
        f"{row['streams']:.0f} joined answers equal the uninterrupted ones, "
        f"{row['resumed']:.0f} resumed (uninterrupted run: {row['reference_errors']:.0f} errors)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
