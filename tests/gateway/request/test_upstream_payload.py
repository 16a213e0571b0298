"""The body sent upstream: the client's own bytes unless something must change."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from gateway.request.upstream_payload import has_engine_fields, payload_for, retention_hint
from policies.schema import EndpointSpec, Pool

POOL = Pool("p", (EndpointSpec("127.0.0.1:1"),))
RAW = b'{"model": "m", "prompt": "hi", "stream": true}'
BODY = orjson.loads(RAW)


def test_the_clients_bytes_go_as_they_are_when_nothing_changes() -> None:
    assert payload_for(BODY, POOL, "m", raw=RAW) is RAW


def test_a_changed_body_is_sent_as_changed() -> None:
    limited = {**BODY, "max_tokens": 16}  # a budget's output limit
    assert orjson.loads(payload_for(limited, POOL, "m", raw=None)) == limited


def test_a_stream_continued_from_text_asks_for_the_engines_counts() -> None:
    sent = orjson.loads(payload_for(BODY, POOL, "m", raw=RAW, usage=True, counts=True))
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    own = {**BODY, "stream_options": {"include_usage": True}}
    sent = orjson.loads(payload_for(own, POOL, "m", raw=None, counts=True))
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


TOOLS = [{"type": "function", "function": {"name": "read_file"}}]


def test_a_call_offering_tools_carries_a_retention_hint_where_the_pool_asks() -> None:
    pool = replace(POOL, kv_retention=30.0)
    agent = {**BODY, "tools": TOOLS}
    hint: Any = retention_hint(pool, agent, "tenant-a")
    (action,) = hint["actions"]
    assert action["action_type"] == "kv.retain"
    assert action["payload"] == {
        "ttl_s": 30.0,
        "owner": "tenant-a",
        "on": ["tool_calls", "tool_use"],
    }
    sent = orjson.loads(payload_for(agent, pool, "m", raw=None, kv_hints=hint))
    assert sent["kv_hints"] == hint and sent["tools"] == TOOLS
    assert retention_hint(POOL, agent, "t") is None  # the pool does not ask
    assert retention_hint(pool, BODY, "t") is None  # no tools: no agent call
    long: Any = retention_hint(pool, agent, "x" * 500)
    assert len(long["actions"][0]["payload"]["owner"]) == 64


def test_a_clients_own_engine_fields_are_dropped() -> None:
    planted = {**BODY, "kv_hints": {"actions": []}, "kv_transfer_params": {"do_remote_prefill": 1}}
    assert has_engine_fields(planted)
    sent = orjson.loads(payload_for(planted, POOL, "m", raw=orjson.dumps(planted)))
    assert sent == BODY
    hint = retention_hint(replace(POOL, kv_retention=5.0), {**planted, "tools": TOOLS}, "t")
    sent = orjson.loads(payload_for(planted, POOL, "m", raw=None, kv_hints=hint))
    assert sent["kv_hints"] == hint and "kv_transfer_params" not in sent
