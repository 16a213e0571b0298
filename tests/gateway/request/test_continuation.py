"""How a broken stream goes on: what it sent (``Progress``), the request that continues it, and
that request's stream rewritten into the first one's shape."""

from __future__ import annotations

import json

import orjson
import pytest

from gateway.base.api import api_of
from gateway.request.continuation import (
    ContinuationRelay,
    Progress,
    continuation,
    ending,
    resumable,
    whole_usage,
)
from kvgate.wire.sse import SSERelay, without_token_ids


def _event(data: object) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def _chat_chunk(
    text: str, ids: list[int] | None = None, reason: str | None = None
) -> dict[str, object]:
    choice: dict[str, object] = {"index": 0, "delta": {"content": text}, "finish_reason": reason}
    if ids is not None:
        choice["token_ids"] = ids
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 5,
        "model": "m",
        "choices": [choice],
    }


OPENING = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 5,
    "model": "m",
    "prompt_token_ids": [1, 2, 3],
    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
}


def test_progress_reads_text_ids_and_the_prompt_off_a_chat_stream() -> None:
    recorded = [
        _event(OPENING) + _event(_chat_chunk("Hel", [7])),
        _event(_chat_chunk("lo", [8, 9])),
    ]
    progress = Progress.of(True, recorded)
    assert (progress.id, progress.created, progress.model) == ("chatcmpl-1", 5, "m")
    assert progress.text == "Hello" and progress.events == 2
    assert progress.token_ids == [7, 8, 9] and progress.generated == 3
    assert progress.prompt_token_ids == [1, 2, 3] and progress.finish_reason is None
    assert progress.resumable


def test_progress_of_a_completion_stream_without_ids_counts_its_events() -> None:
    chunk = {"id": "cmpl-1", "created": 1, "model": "m", "choices": [{"index": 0, "text": "ab"}]}
    progress = Progress.of(False, [_event(chunk), _event(chunk), b"data: [DONE]\n\n"])
    assert progress.text == "abab" and progress.generated == 2 and progress.token_ids is None


@pytest.mark.parametrize(
    "choice",
    [
        {"index": 1, "delta": {"content": "x"}},  # a second choice
        {"index": 0, "delta": {"tool_calls": [{"index": 0}]}},  # a tool call
    ],
)
def test_several_choices_or_tool_calls_are_not_resumable(choice: dict[str, object]) -> None:
    progress = Progress.of(True, [_event({"id": "c", "choices": [choice]})])
    assert not progress.resumable


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        ("/v1/chat/completions", {"messages": []}, True),
        ("/v1/completions", {"prompt": "p"}, True),
        ("/v1/completions", {"prompt": ["a", "b"]}, False),  # several prompts
        ("/v1/completions", {"prompt": [1, 2]}, False),  # token ids: not resumed from text
        ("/v1/chat/completions", {"n": 2}, False),
        ("/v1/chat/completions", {"logprobs": True}, False),
        ("/v1/chat/completions", {"tools": [{"type": "function"}]}, False),
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, False),
        ("/v1/responses", {"input": "x"}, False),
    ],
)
def test_what_can_be_resumed(path: str, body: dict[str, object], expected: bool) -> None:
    assert resumable(api_of(path), body) is expected


def test_a_continuation_from_token_ids_is_a_completion_of_the_ids_so_far() -> None:
    progress = Progress(
        True, id="c", text="Hello", events=2, token_ids=[7, 8, 9], prompt_token_ids=[1, 2]
    )
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 10,
        "temperature": 0,
        "seed": 3,
        "tools_choice": "none",
    }
    path, sent = continuation(body, progress, token_ids=True)
    assert path == "/v1/completions"
    assert sent == {
        "model": "m",
        "prompt": [1, 2, 7, 8, 9],
        "temperature": 0,
        "seed": 3,
        "max_tokens": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }


def test_a_chat_continuation_from_text_continues_the_final_message() -> None:
    progress = Progress(True, id="c", text="Once upon", events=2)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "a story"}],
        "max_tokens": 5,
        "min_tokens": 4,
    }
    path, sent = continuation(body, progress, token_ids=False)
    assert path == "/v1/chat/completions"
    assert sent["messages"] == [
        {"role": "user", "content": "a story"},
        {"role": "assistant", "content": "Once upon"},
    ]
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert (sent["max_tokens"], sent["min_tokens"]) == (3, 2)
    assert "return_token_ids" not in sent


def test_a_completion_continuation_from_text_extends_the_prompt() -> None:
    progress = Progress(False, id="c", text=" upon", events=1)
    _, sent = continuation({"model": "m", "prompt": "Once"}, progress, True)
    assert sent["prompt"] == "Once upon" and "max_tokens" not in sent


def _relay_out(relay: SSERelay, *chunks: object) -> list[object]:
    out = relay.feed(b"".join(_event(c) if not isinstance(c, bytes) else c for c in chunks))
    return [
        "[DONE]" if e == b"data: [DONE]" else json.loads(e[6:]) for e in out.split(b"\n\n") if e
    ]


def test_a_token_id_continuation_is_rewritten_into_the_chat_stream() -> None:
    progress = Progress(
        True,
        id="chatcmpl-1",
        created=5,
        model="m",
        text="He",
        events=1,
        token_ids=[7],
        prompt_token_ids=[1, 2, 3],
    )
    relay = ContinuationRelay(progress, client_wants_usage=True, client_ids=False)
    completion = {
        "id": "cmpl-9",
        "object": "text_completion",
        "created": 99,
        "model": "m",
        "choices": [],
    }
    first = {
        **completion,
        "choices": [
            {"index": 0, "text": "llo", "token_ids": [8, 9], "prompt_token_ids": [1, 2, 3, 7]}
        ],
    }
    last = {
        **completion,
        "choices": [{"index": 0, "text": "!", "token_ids": [10], "finish_reason": "length"}],
    }
    usage = {
        **completion,
        "usage": {
            "prompt_tokens": 4,
            "completion_tokens": 3,
            "total_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }
    out = _relay_out(relay, first, last, usage, b"data: [DONE]\n\n")
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 5, "model": "m"}
    assert out == [
        {
            **head,
            "choices": [
                {"index": 0, "logprobs": None, "finish_reason": None, "delta": {"content": "llo"}}
            ],
        },
        {
            **head,
            "choices": [
                {"index": 0, "logprobs": None, "finish_reason": "length", "delta": {"content": "!"}}
            ],
        },
        {
            **head,
            "choices": [],
            "usage": {
                "prompt_tokens": 3,
                "completion_tokens": 4,
                "total_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 3},
            },
        },
        "[DONE]",
    ]
    assert relay.saw_done and progress.text == "Hello!" and progress.token_ids == [7, 8, 9, 10]
    assert relay.usage == out[2]["usage"]  # type: ignore[index]


def test_a_text_continuation_drops_its_opening_and_counts_the_prompt_it_resent() -> None:
    progress = Progress(True, id="chatcmpl-1", created=5, model="m", text="Once", events=2)
    relay = ContinuationRelay(progress, client_wants_usage=False, client_ids=False)
    opening = {**OPENING, "id": "chatcmpl-2"}
    chunk = {**_chat_chunk(" upon", [5]), "id": "chatcmpl-2"}
    usage = {
        "id": "chatcmpl-2",
        "choices": [],
        "usage": {"prompt_tokens": 12, "completion_tokens": 1},
    }
    out = _relay_out(relay, opening, chunk, usage)
    assert [o["choices"][0]["delta"] for o in out] == [{"content": " upon"}]  # type: ignore[index]
    assert all(o["id"] == "chatcmpl-1" for o in out)  # type: ignore[index]
    assert relay.usage == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}


def test_the_client_s_own_token_ids_are_kept() -> None:
    progress = Progress(
        False, id="cmpl-1", created=5, model="m", token_ids=[], prompt_token_ids=[1]
    )
    relay = ContinuationRelay(progress, client_wants_usage=False, client_ids=True)
    out = _relay_out(relay, {"id": "x", "choices": [{"index": 0, "text": "a", "token_ids": [4]}]})
    assert out[0]["choices"][0]["token_ids"] == [4]  # type: ignore[index]


def test_a_stream_that_broke_after_its_last_token_only_gets_its_end() -> None:
    progress = Progress(
        True,
        id="c",
        created=1,
        model="m",
        token_ids=[4, 5],
        prompt_token_ids=[1],
        finish_reason="stop",
    )
    tail = ending(progress, client_wants_usage=True)
    assert tail is not None and tail.endswith(b"data: [DONE]\n\n")
    assert json.loads(tail.split(b"\n\n")[0][6:])["usage"] == {
        "prompt_tokens": 1,
        "completion_tokens": 2,
        "total_tokens": 3,
    }
    assert ending(progress, client_wants_usage=False) == b"data: [DONE]\n\n"
    assert ending(Progress(True, id="c"), client_wants_usage=True) is None
    assert whole_usage(Progress(True), None) is None


def test_a_recording_relay_keeps_the_ids_and_forwards_without_them() -> None:
    relay = SSERelay(strip_usage=True, record=True, strip_token_ids=True)
    events = _event(OPENING) + _event(_chat_chunk("a", [7]))
    out = relay.feed(events)
    assert relay.recorded == [events]
    assert b"token_ids" not in out
    assert [json.loads(e[6:]) for e in out.split(b"\n\n") if e] == [
        {k: v for k, v in OPENING.items() if k != "prompt_token_ids"},
        {**_chat_chunk("a")},
    ]


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (b'{"a":1,"token_ids":[1, 2]}', b'{"a":1}'),
        (b'{"token_ids":[1],"a":1}', b'{"a":1}'),
        (b'{"prompt_token_ids": [1,2] , "a":1}', b'{"a":1}'),
        (b'{"a":1,"token_ids":null,"b":2}', b'{"a":1,"b":2}'),
        (b'{"text":"\\"token_ids\\":[1]"}', b'{"text":"\\"token_ids\\":[1]"}'),  # in a string
        (
            b'data: {"prompt_token_ids":[1],"choices":[{"text":"a","token_ids":[2]}]}\n\n'
            b'data: {"choices":[{"token_ids":[3], "text":"b"}]}\n\n',
            b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choices":[{"text":"b"}]}\n\n',
        ),
        (b'{"token_ids":[]}', b"{}"),
        (b'{"a":"token_ids"}', b'{"a":"token_ids"}'),  # the word, not a key
    ],
)
def test_token_ids_are_cut_out_of_events(event: bytes, expected: bytes) -> None:
    assert without_token_ids(event) == expected


def test_tokens_without_text_of_their_own_are_counted_not_sent() -> None:
    """A token whose bytes do not make a character yet (UTF-8 split over tokens) comes as an
    empty delta: it is part of what was generated."""
    progress = Progress(
        False, id="cmpl-1", created=5, model="m", token_ids=[1], prompt_token_ids=[9]
    )
    relay = ContinuationRelay(progress, client_wants_usage=False, client_ids=False)
    out = _relay_out(
        relay,
        {"id": "x", "choices": [{"index": 0, "text": "", "token_ids": [226]}]},
        {"id": "x", "choices": [{"index": 0, "text": "é", "token_ids": [130]}]},
    )
    assert [o["choices"][0]["text"] for o in out] == ["é"]  # type: ignore[index]
    assert progress.token_ids == [1, 226, 130]


def _counted(text: str, prompt: int, completion: int) -> dict[str, object]:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return {**_chat_chunk(text), "usage": usage}


def test_a_text_continuation_counts_tokens_as_the_engine_did_not_events() -> None:
    # two events of several tokens each (stream intervals, speculative decoding)
    recorded = [_event(_counted("Once upon", 10, 3)) + _event(_counted(" a time", 10, 6))]
    progress = Progress.of(True, recorded)
    assert (progress.events, progress.generated) == (2, 6)
    body = {"model": "m", "messages": [{"role": "user", "content": "a story"}], "max_tokens": 8}
    _, sent = continuation(body, progress, token_ids=False)
    assert sent["max_tokens"] == 2  # 8 asked, 6 written: the joined answer stays within 8
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    relay = ContinuationRelay(progress, client_wants_usage=True, client_ids=False)
    # the continuation's prompt holds the first stream's 10 and the 6 tokens written (re-tokenized
    # as 5: text does not always split the same way); it writes 2 more
    out = _relay_out(
        relay,
        _counted(" there", 15, 1),
        _counted(" was", 15, 2),
        {"id": "c", "choices": [], "usage": {"prompt_tokens": 15, "completion_tokens": 2}},
    )
    assert out[-1]["usage"] == {  # type: ignore[index]
        "prompt_tokens": 10,
        "completion_tokens": 8,
        "total_tokens": 18,
    }
    assert all("usage" not in o for o in out[:-1])  # type: ignore[operator]


def test_a_stream_cut_with_counts_is_metered_from_them() -> None:
    progress = Progress.of(True, [_event(_counted("Once upon", 10, 3))])
    assert whole_usage(progress, None) == {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "total_tokens": 13,
    }
