"""The reference backend's forced tool calls (``tool_choice``) and ``kv.retain`` hints, through
the real ``openai`` client: a call's structure, streamed and whole; a session's blocks kept
through its tool pause while other traffic fills the cache, and evicted without the hint."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.fakes import close_after_test
from tests.integration.metrics_util import value

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}},
]


def retain(ttl: float, owner: str = "tenant-a") -> dict[str, object]:
    action = {
        "action_id": "a1",
        "action_type": "kv.retain",
        "action_version": "1.0",
        "payload": {"ttl_s": ttl, "owner": owner},
    }
    return {"kv_hints": {"protocol_version": "1", "message_id": "m1", "actions": [action]}}


def test_a_forced_tool_choice_answers_with_a_call(start_backend: Callable[..., str]) -> None:
    url = start_backend("--cost", "zero")
    api = close_after_test(openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0))
    messages = [{"role": "user", "content": "fix the bug"}]
    whole = api.chat.completions.create(
        model="kvgate-sim", messages=messages, max_tokens=8, tools=TOOLS, tool_choice="required"
    )  # type: ignore[call-overload]
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "read_file" and set(json.loads(call.function.arguments)) == {
        "text"
    }
    named = {"type": "function", "function": {"name": "run_tests"}}
    stream = api.chat.completions.create(
        model="kvgate-sim", messages=messages, max_tokens=8, tools=TOOLS, tool_choice=named,
        stream=True,
    )  # type: ignore[call-overload]  # fmt: skip
    names, arguments, reasons = [], "", []
    for chunk in stream:
        for delta_call in chunk.choices[0].delta.tool_calls or []:
            if delta_call.function and delta_call.function.name:
                names.append(delta_call.function.name)
            arguments += (delta_call.function.arguments or "") if delta_call.function else ""
        reasons.append(chunk.choices[0].finish_reason)
    assert names == ["run_tests"] and "text" in json.loads(arguments)
    assert reasons[-1] == "tool_calls"
    text = api.chat.completions.create(
        model="kvgate-sim", messages=messages, max_tokens=4, tools=TOOLS, tool_choice="auto"
    )  # type: ignore[call-overload]
    assert text.choices[0].message.tool_calls is None  # it never decides to call on its own


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "not among tools"),
        ({"tools": [{"type": "function"}]}, "a function with a name"),
        ({"kv_hints": {"actions": "all"}}, "list of actions"),
        ({"kv_hints": {"actions": [{"action_type": "kv.retain", "payload": {"ttl_s": -1}}]}},
         "ttl_s must be a positive"),
    ],
)  # fmt: skip
def test_bad_tools_and_hints_are_refused_clearly(
    backend_url: str, fields: dict[str, object], message: str
) -> None:
    api = close_after_test(openai.OpenAI(base_url=f"{backend_url}/v1", api_key="x", max_retries=0))
    with pytest.raises(openai.BadRequestError, match=message):
        api.chat.completions.create(
            model="kvgate-sim",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            extra_body=fields,
        )


def _session_survives(url: str, hint: dict[str, object]) -> int:
    """A session's call ending in a tool call, then other traffic filling the cache, then the
    session's next call: the tokens of its first call's prompt found cached."""
    api = close_after_test(openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0))
    history: list[Any] = [{"role": "user", "content": "session task: " + "read the module " * 8}]
    api.chat.completions.create(
        model="kvgate-sim", messages=history, max_tokens=4, tools=TOOLS, tool_choice="required",
        extra_body=hint,
    )  # type: ignore[call-overload]  # fmt: skip
    for k in range(6):  # unhinted traffic: more than the cache holds besides
        api.completions.create(model="kvgate-sim", prompt=f"{k} other " * 20, max_tokens=1)
    follow: list[Any] = [*history, {"role": "tool", "tool_call_id": "c", "content": "ok"}]
    again = api.chat.completions.create(model="kvgate-sim", messages=follow, max_tokens=1)
    details = again.usage.prompt_tokens_details if again.usage else None
    return details.cached_tokens or 0 if details else 0


def test_a_retained_session_keeps_its_blocks_through_the_pause(
    start_backend: Callable[..., str],
) -> None:
    args = ("--cost", "zero", "--num-blocks", "24", "--max-model-len", "256")
    kept = start_backend(*args, "--kv-retention-owner-fraction", "0.5")
    assert _session_survives(kept, retain(30.0)) >= 144  # every full block of its prompt
    assert value(kept, "kvgate:kv_retained_blocks") > 0
    assert value(kept, "kvgate:kv_retained_hits_total") >= 128
    bounded = start_backend(*args)  # one owner may keep a quarter: 6 of 24 blocks
    assert _session_survives(bounded, retain(30.0)) == 6 * 16
    lost = start_backend(*args)
    assert _session_survives(lost, {}) == 0  # without the hint, LRU took it
    off = start_backend(*args, "--kv-retention-fraction", "0")
    assert _session_survives(off, retain(30.0)) == 0  # retention off: the hint is a no-op
