"""The Responses API as every part reads it (OpenAI paths): input as chat messages and a
response stream's end, usage and id."""

from __future__ import annotations

import json

import pytest

from kvgate.wire.responses_api import InputError, input_messages
from kvgate.wire.sse import ResponsesRelay
from kvgate.wire.token_usage import token_counts


def event(kind: str, **fields: object) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


RESPONSE = {"id": "resp_1", "object": "response", "status": "in_progress", "usage": None}
USAGE = {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}
STREAM = (
    event("response.created", response=RESPONSE)
    + event("response.output_text.delta", delta='he said "error" and "response"')
    + event("response.completed", response={**RESPONSE, "status": "completed", "usage": USAGE})
)


@pytest.mark.parametrize("split", [1, 9, 64, 10_000])
def test_a_response_stream_ends_with_its_terminal_event(split: int) -> None:
    relay = ResponsesRelay()
    out = b"".join(relay.feed(STREAM[i : i + split]) for i in range(0, len(STREAM), split))
    assert out == STREAM  # nothing dropped or changed
    assert relay.saw_done and relay.usage == USAGE and relay.response_id == "resp_1"
    assert token_counts(relay.usage) == (7, 3, 0)


def test_a_response_stream_cut_before_its_end_is_not_done() -> None:
    relay = ResponsesRelay()
    relay.feed(STREAM[: STREAM.index(b"event: response.completed")])
    assert not relay.saw_done and relay.usage is None and relay.response_id == "resp_1"
    error = relay.error_event("upstream ended the stream", "upstream_stream_broken")
    name, data = error.decode().split("\n")[:2]
    assert name == "event: error"
    assert json.loads(data[len("data: ") :])["code"] == "upstream_stream_broken"


def test_an_upstream_error_event_fails_the_stream() -> None:
    relay = ResponsesRelay()
    out = relay.feed(event("response.created", response=RESPONSE) + event("error", message="boom"))
    assert relay.failed == "boom" and not relay.saw_done and relay.usage is None
    assert b"boom" not in out  # held back: the gateway ends the stream with its own error


def test_input_as_chat_messages() -> None:
    body = {
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "yo"}]},
            {"type": "function_call", "name": "f", "arguments": "{}"},
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        ],
    }  # fmt: skip
    assert input_messages(body) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "ab"},
    ]
    assert input_messages({"input": "plain"}) == [{"role": "user", "content": "plain"}]
    with pytest.raises(InputError, match=r"input\[2\]"):
        input_messages(body, strict=True)
    with pytest.raises(InputError, match="string or a list"):
        input_messages({"input": 5}, strict=True)
