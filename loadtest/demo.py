"""``kvgate demo``: three simulated backends behind the gateway, on embedded defaults.

It shows what the gateway is for: conversations that share a long system prompt are sent to
the backend that already holds that prefix in its KV cache (the embedded endpoint picker), so
their time to first token drops from a full prefill to almost nothing — visible in
``cached_tokens``, in the latency, and in each backend's ``vllm:prefix_cache_hits``. Later
issues grow this into the full demo (load test, plots, policy comparison).
"""

from __future__ import annotations

import asyncio
import tempfile
from contextlib import ExitStack
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from loadtest.client.sse import stream_request
from loadtest.harness.processes import backend_process, free_port, gateway_process

ASSISTANTS = {
    "logistics": "You are a meticulous assistant for a logistics company. Cite the policy. ",
    "legal": "You are a careful paralegal. Quote the clause you rely on and never give advice. ",
    "support": "You are a friendly support agent for a router vendor. Ask for the model number. ",
}
QUESTIONS = ["Where is my parcel?", "Can I change the address?", "How long does it take?"]
WATCHED = ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries", "vllm:request_success")


async def scrape(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with session.get(f"{base}/metrics") as response:
        text = await response.text()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in WATCHED:
            values[family.name] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    return values


async def run_demo(gateway: str, backends: list[str]) -> None:
    async with aiohttp.ClientSession() as session:
        print(f"gateway {gateway} -> backends {', '.join(backends)}\n")
        for question in QUESTIONS:
            for name, system in ASSISTANTS.items():
                chat = {
                    "model": "kvgate-sim",
                    "max_tokens": 12,
                    "messages": [
                        {"role": "system", "content": system * 20},
                        {"role": "user", "content": question},
                    ],
                }
                result = await stream_request(session, f"{gateway}/v1/chat/completions", chat)
                print(
                    f"  {name:9} {question:27} status={result.status} "
                    f"prompt={result.usage.get('prompt_tokens')} cached={result.cached_tokens:4} "
                    f"ttft={result.ttft * 1000:6.1f}ms"
                )
        print()
        for base in backends:
            values = await scrape(session, base)
            print(
                f"  backend {base}: served={values.get('vllm:request_success', 0):g} "
                f"prefix_cache_hits={values.get('vllm:prefix_cache_hits', 0):g} tokens "
                f"of {values.get('vllm:prefix_cache_queries', 0):g} queried"
            )


def main() -> int:
    ports = [free_port() for _ in range(3)]
    gateway_port = free_port()
    with tempfile.TemporaryDirectory(prefix="kvgate-demo-") as directory, ExitStack() as stack:
        policy = Path(directory) / "policy.yaml"
        endpoints = ", ".join(f"127.0.0.1:{p}" for p in ports)
        policy.write_text(
            f"pools: {{sims: {{endpoints: [{endpoints}]}}}}\n"
            "routes: [{model: kvgate-sim, pool: sims}]\n"
            'observability: {access_log: "off"}\n'
        )
        for port in ports:
            stack.enter_context(backend_process(port))
        stack.enter_context(gateway_process(str(policy), gateway_port))
        asyncio.run(
            run_demo(f"http://127.0.0.1:{gateway_port}", [f"http://127.0.0.1:{p}" for p in ports])
        )
    print("\ndemo finished: gateway and backends stopped cleanly")
    return 0
