"""The body sent upstream: the client's own bytes unless something must change."""

from __future__ import annotations

import orjson

from gateway.request.upstream_payload import payload_for
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
