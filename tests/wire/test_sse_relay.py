"""Relaying SSE: events split across reads, usage read and stripped, [DONE] seen."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from kvgate.wire.sse import MAX_EVENT_BYTES, EventTooLarge, SSERelay

DELTA = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize("split", [1, 7, 20, 64, 1000])
def test_events_across_arbitrary_reads(split: int) -> None:
    stream = DELTA * 3 + USAGE + DONE
    relay = SSERelay(strip_usage=True)
    out = b"".join(relay.feed(stream[i : i + split]) for i in range(0, len(stream), split))
    assert out == DELTA * 3 + DONE
    assert relay.usage == {"prompt_tokens": 3, "completion_tokens": 2}
    assert relay.saw_done and relay.pending == b""


def test_usage_kept_when_the_client_asked() -> None:
    relay = SSERelay(strip_usage=False)
    assert relay.feed(DELTA + USAGE + DONE) == DELTA + USAGE + DONE
    assert relay.usage is not None


def test_crlf_and_partial_tail() -> None:
    relay = SSERelay(strip_usage=True)
    out = relay.feed(DELTA.replace(b"\n", b"\r\n") + b'data: {"choi')
    assert out == DELTA and relay.pending == b'data: {"choi' and not relay.saw_done


def test_usage_inside_a_content_chunk_is_read_not_dropped() -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": "x"}}], "usage": {"prompt_tokens": 1}}
    event = f"data: {json.dumps(chunk)}\n\n".encode()
    relay = SSERelay(strip_usage=True)
    assert relay.feed(event) == event and relay.usage == {"prompt_tokens": 1}


@pytest.mark.parametrize("pad", [0, 5000], ids=["small body", "large body"])
def test_usage_of_a_json_body(pad: int) -> None:
    from kvgate.wire.sse import usage_of

    def encoded(body: Mapping[str, object]) -> bytes:
        return json.dumps({"pad": "x" * pad, **body} if pad else body).encode()

    body = {
        "choices": [{"text": 'a "usage" word'}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4},
    }
    assert usage_of(encoded(body)) == {"prompt_tokens": 3, "completion_tokens": 4}
    assert usage_of(b" " * pad + b'{"choices": []}') is None
    assert usage_of(b" " * pad + b'{"usage": null}') is None
    # a null usage followed by another object: that object is not the usage
    assert usage_of(encoded({"usage": None, "x": {"prompt_tokens": 9}})) is None
    assert usage_of(b" " * pad + b'not json "usage": {') is None
    nested = {"usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}}
    assert usage_of(encoded(nested)) == nested["usage"]
    deeper = {"usage": {"prompt_tokens": 3, "details": {"a": {"b": 1}}}}
    assert usage_of(encoded(deeper)) == deeper["usage"]
    # a brace inside a string defeats the brace count: the whole body is parsed instead
    odd = {"usage": {"note": "}{", "prompt_tokens": 1}, "choices": []}
    assert usage_of(encoded(odd)) == odd["usage"]
    # usage before the choices, whose text mentions "usage" again (escaped in the JSON)
    first = {"usage": {"prompt_tokens": 5}, "choices": [{"text": 'the "usage" key'}]}
    assert usage_of(encoded(first)) == {"prompt_tokens": 5}


@pytest.mark.parametrize("split", [1, 2, 3, 5])
def test_crlf_blank_lines_split_anywhere_still_end_events(split: int) -> None:
    stream = (DELTA * 2 + DONE).replace(b"\n", b"\r\n")
    relay = SSERelay(strip_usage=True)
    out = b"".join(relay.feed(stream[i : i + split]) for i in range(0, len(stream), split))
    assert out == DELTA * 2 + DONE and relay.saw_done and relay.pending == b""


def test_an_event_split_over_many_reads_comes_out_whole_once_it_ends() -> None:
    relay = SSERelay(strip_usage=False)
    event = b"data: " + b"x" * 100_000 + b"\n\n"
    outs = [relay.feed(event[i : i + 1000]) for i in range(0, len(event), 1000)]
    assert outs[-1] == event and not any(outs[:-1])
    assert relay.pending == b""


def test_an_event_that_never_ends_fails_past_the_limit_instead_of_growing() -> None:
    relay = SSERelay(strip_usage=False)
    relay.feed(b"data: ")
    chunk = b"x" * (1 << 20)
    with pytest.raises(EventTooLarge, match="16 MiB"):
        for _ in range(MAX_EVENT_BYTES // len(chunk) + 1):
            relay.feed(chunk)
    assert len(relay.pending) <= MAX_EVENT_BYTES + len(chunk)


# vLLM's shape of a failure mid-stream (EngineDeadError, GenerationError): an event whose data
# is an ErrorResponse, then [DONE]; older vLLM sent the ErrorResponse's fields at the top level
VLLM_ERROR = (
    b'data: {"error": {"message": "EngineCore encountered an issue.", '
    b'"type": "InternalServerError", "param": null, "code": 500}}\n\n'
)
OLD_VLLM_ERROR = (
    b'data: {"object": "error", "message": "EngineCore encountered an issue.", '
    b'"type": "InternalServerError", "param": null, "code": 500}\n\n'
)


@pytest.mark.parametrize("error", [VLLM_ERROR, OLD_VLLM_ERROR], ids=["vllm", "older-vllm"])
@pytest.mark.parametrize("split", [1, 13, 10_000])
def test_vllm_s_error_event_fails_the_stream_and_nothing_after_it_goes_out(
    error: bytes, split: int
) -> None:
    stream = DELTA * 2 + error + DONE
    relay = SSERelay(strip_usage=True)
    out = b"".join(relay.feed(stream[i : i + split]) for i in range(0, len(stream), split))
    assert out == DELTA * 2  # the error and the [DONE] after it are held back
    assert relay.failed == "EngineCore encountered an issue."
    assert not relay.saw_done


def test_content_that_mentions_error_is_content() -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": '{"error": "not mine"}'}}]}
    event = b"data: " + json.dumps(chunk).encode() + b"\n\n"
    relay = SSERelay(strip_usage=True)
    assert relay.feed(event + DONE) == event + DONE and not relay.failed


def test_per_chunk_counts_are_recorded_and_stripped_from_what_goes_out() -> None:
    counted = {
        "choices": [{"index": 0, "delta": {"content": "hi"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    event = b"data: " + json.dumps(counted).encode() + b"\n\n"
    relay = SSERelay(strip_usage=True, record=True, strip_counts=True)
    out = relay.feed(event + USAGE + DONE)
    assert json.loads(out.split(b"\n\n")[0][6:]) == {"choices": counted["choices"]}
    assert out.endswith(DONE) and USAGE not in out
    assert relay.recorded == [event + DONE]  # what the engine said, for a continuation
    assert relay.usage == {"prompt_tokens": 3, "completion_tokens": 2}


def test_events_before_the_first_that_matters_pass_unread_and_what_matters_is_read() -> None:
    plain = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n' * 3
    relay = SSERelay(strip_usage=True)
    assert relay.feed(plain) == plain and [relay.usage] == [None]
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n'
    assert relay.feed(plain + usage + DONE) == plain + DONE  # the usage read, and stripped
    assert relay.usage == {"prompt_tokens": 1} and relay.saw_done
    failing = SSERelay(strip_usage=False)
    assert failing.feed(plain + b'data: {"error":{"message":"boom"}}\n\n' + plain) == plain
    assert failing.failed == "boom"
    begun = SSERelay(strip_usage=False)
    assert begun.feed(b'data: {"choices":') == b""  # an event begun: what follows completes it
    rest = b'[]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":7}}\n\n'
    assert begun.feed(rest) == b'data: {"choices":' + rest
    assert begun.usage == {"prompt_tokens": 7}
