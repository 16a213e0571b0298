"""Agents' blocks kept through tool pauses, end to end: a gateway whose pool sets
``kv_retention`` tells the reference backend to keep an agent call's blocks when its answer is
a tool call, so the session's next call finds its history cached after other traffic filled
the cache; without it the cache's LRU takes them; a client cannot plant its own hint."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai

from loadtest.harness.processes import KvgateProcess
from tests.fakes import close_after_test
from tests.integration.metrics_util import value

TOOLS: list[Any] = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
BACKEND = ("--cost", "zero", "--num-blocks", "24", "--max-model-len", "384")


def policy(backend: str, retention: str) -> str:
    return f"""
pools: {{p: {{endpoints: [{backend.removeprefix("http://")}]{retention}}}}}
routes: [{{model: kvgate-sim, pool: p}}]
observability: {{access_log: "off"}}
"""


def next_call_cached(url: str, **planted: object) -> tuple[int, str | None]:
    """An agent's call through the gateway, other traffic, then its next call: the tokens of
    the next call found cached, and the first call's finish reason."""
    api = close_after_test(openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0))
    history: list[Any] = [{"role": "user", "content": "agent task: " + "inspect the parser " * 7}]
    first = api.chat.completions.create(
        model="kvgate-sim", messages=history, max_tokens=4, tools=TOOLS, tool_choice="required",
        extra_body=planted or None,
    )  # fmt: skip
    for k in range(6):
        api.completions.create(model="kvgate-sim", prompt=f"{k} other " * 20, max_tokens=1)
    calls = first.choices[0].message.tool_calls or []
    history += [
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "tool_call_id": calls[0].id if calls else "c", "content": "def f(): 1"},
    ]
    again = api.chat.completions.create(model="kvgate-sim", messages=history, max_tokens=1)
    details = again.usage.prompt_tokens_details if again.usage else None
    return (details.cached_tokens or 0) if details else 0, first.choices[0].finish_reason


def test_the_gateway_keeps_an_agents_blocks_through_its_tool_pause(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    kept = start_backend(*BACKEND, "--kv-retention-owner-fraction", "0.5")
    url, _ = start_gateway(policy(kept, ", kv_retention: 30s"))
    cached, reason = next_call_cached(url)
    assert reason == "tool_calls" and cached >= 144
    assert value(kept, "kvgate:kv_retained_hits_total") >= 144

    lost = start_backend(*BACKEND, "--kv-retention-owner-fraction", "0.5")
    url, _ = start_gateway(policy(lost, ""))
    assert next_call_cached(url)[0] == 0


def test_a_client_cannot_plant_its_own_retention_hint(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    backend = start_backend(*BACKEND, "--kv-retention-owner-fraction", "0.5")
    url, _ = start_gateway(policy(backend, ""))
    action = {"action_type": "kv.retain", "payload": {"ttl_s": 300, "owner": "victim"}}
    cached, _ = next_call_cached(url, kv_hints={"actions": [action]})
    assert cached == 0 and value(backend, "kvgate:kv_retained_blocks") == 0
