"""Anthropic's Messages API as every part reads it: system and content blocks as chat
messages, a stream's end and usage, and the error shapes."""

from __future__ import annotations

import json

import pytest

from kvgate.wire.messages_api import ContentError, chat_messages, error_body, error_event
from kvgate.wire.sse import MessagesRelay
from kvgate.wire.token_usage import token_counts


def event(kind: str, **fields: object) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


START_USAGE = {"input_tokens": 3, "cache_read_input_tokens": 16, "output_tokens": 0}
STREAM = (
    event("message_start", message={"id": "msg_1", "usage": START_USAGE})
    + event("content_block_start", index=0, content_block={"type": "text", "text": ""})
    + event("ping")
    + event("content_block_delta", index=0, delta={"type": "text_delta", "text": '"usage" "error"'})
    + event("content_block_stop", index=0)
    + event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 9})
    + event("message_stop")
)


@pytest.mark.parametrize("split", [1, 7, 64, 10_000])
def test_a_message_stream_ends_with_message_stop_and_adds_up_its_usage(split: int) -> None:
    relay = MessagesRelay()
    out = b"".join(relay.feed(STREAM[i : i + split]) for i in range(0, len(STREAM), split))
    assert out == STREAM  # nothing dropped or changed
    assert relay.saw_done and relay.usage is not None
    assert token_counts(relay.usage) == (19, 9, 16)  # the start's prompt, the delta's output


def test_a_message_stream_cut_before_its_end_is_not_done_and_ends_in_an_error_event() -> None:
    relay = MessagesRelay()
    relay.feed(STREAM[: STREAM.index(b"event: message_delta")])
    assert not relay.saw_done
    assert relay.usage is None  # message_start's output (0) is not the answer's
    name, data = (
        relay.error_event("upstream stalled", "upstream_stream_broken").decode().split("\n")[:2]
    )
    assert name == "event: error"
    assert json.loads(data.removeprefix("data: ")) == {
        "type": "error",
        "error": {"type": "api_error", "message": "upstream stalled"},
    }
    failed = MessagesRelay()
    error = event("error", error={"type": "overloaded_error", "message": "busy"})
    out = failed.feed(STREAM[: STREAM.index(b"event: ping")] + error)
    # the engine's own account of its failure: held back (the gateway ends the stream with its
    # error event), the stream not done
    assert failed.failed == "busy" and not failed.saw_done
    assert b"overloaded_error" not in out


def test_system_and_text_blocks_become_chat_messages() -> None:
    body = {
        "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
        ],
    }
    expected = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]
    assert chat_messages(body) == chat_messages(body, strict=True) == expected
    assert chat_messages({"system": "", "messages": []}) == []


def test_what_is_not_text_is_routed_as_its_json_and_refused_where_generated() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}
    other = {"type": "image", "source": {"type": "url", "url": "http://x/b.png"}}
    body = {"messages": [{"role": "user", "content": [image, {"type": "text", "text": "?"}]}]}
    routed = chat_messages(body)[0]["content"]
    assert "a.png" in routed and routed.endswith("?")
    other_body = {"messages": [{"role": "user", "content": [other, {"type": "text", "text": "?"}]}]}
    assert chat_messages(other_body) != chat_messages(body)  # two images do not look alike
    with pytest.raises(ContentError, match=r"messages\[0\].content\[0\] is not a text block"):
        chat_messages(body, strict=True)
    with pytest.raises(ContentError, match="a list of messages"):
        chat_messages({"messages": "hi"}, strict=True)
    with pytest.raises(ContentError, match=r"messages\[0\] must be an object"):
        chat_messages({"messages": ["hi"]}, strict=True)
    assert chat_messages({"messages": ["hi"]}) == [{"role": "user", "content": '"hi"'}]


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (405, "invalid_request_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
    ],
)
def test_each_status_has_anthropics_error_type(status: int, error_type: str) -> None:
    assert error_body(status, "m") == {
        "type": "error",
        "error": {"type": error_type, "message": "m"},
    }
    assert error_event("m", status).startswith("event: error\ndata: {")
