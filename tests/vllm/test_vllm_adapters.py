"""The gateway places a LoRA adapter on real vLLM servers itself: the adapter is loaded by the
gateway through vLLM's dynamic adapter API (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, set by the
harness) on the server its first request goes to, and its requests are served from there."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import openai
import pytest

from loadtest.harness.processes import free_port, gateway_process
from loadtest.harness.vllm import VllmServer
from tests.fakes import close_after_test
from tests.integration.metrics_util import scrape

ADAPTER = "placed-sql"  # not the name other tests load by hand


def served_models(server: VllmServer) -> set[str]:
    with urllib.request.urlopen(f"{server.url}/v1/models", timeout=30) as answer:
        return {model["id"] for model in json.load(answer)["data"]}


def test_the_gateway_loads_an_adapter_where_its_requests_go(
    vllm_servers: list[VllmServer], tiny_model: str, tmp_path: Path
) -> None:
    assert not any(ADAPTER in served_models(s) for s in vllm_servers)
    source = Path(tiny_model).parent / "lora-sql"
    endpoints = ", ".join(s.address for s in vllm_servers)
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"""
pools:
  vllm: {{engine: vllm, adapters: {{{ADAPTER}: {source}}}, max_adapters: 2,
          endpoints: [{endpoints}]}}
routes: [{{model: {ADAPTER}, pool: vllm}}]
""")
    port = free_port()
    with gateway_process(str(policy), port, log=str(tmp_path / "gateway.log")):
        url = f"http://127.0.0.1:{port}"
        client = close_after_test(openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0))
        for _ in range(3):
            answer = client.completions.create(model=ADAPTER, prompt="select", max_tokens=4)
            # the tiny model's random weights may decode to nothing: count the tokens
            assert answer.model == ADAPTER and answer.usage is not None
            assert answer.usage.completion_tokens == 4
        holders = [s.address for s in vllm_servers if ADAPTER in served_models(s)]
        changes = {
            s.labels["outcome"]: s.value for s in scrape(url)["kvgate_adapter_changes_total"]
        }
    assert len(holders) == 1, holders  # loaded once, where all three went
    assert changes == pytest.approx({"loaded": 1.0})
