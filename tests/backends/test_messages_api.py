"""The reference backend's Anthropic Messages API, in this test's event loop: a whole message
and its usage (the cached part of the prompt reported as Anthropic reports it), the stream's
named events in Anthropic's order, and its error bodies."""

from __future__ import annotations

import json

import aiohttp

from backends.server.messages_api import STOP_REASONS
from tests.backends.pd.servers import ServerFactory, start_worker

SYSTEM = "You answer questions about parcels in one short sentence. " * 8
BODY = {
    "model": "kvgate-sim",
    "system": [{"type": "text", "text": SYSTEM}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "Where is it?"}]}],
    "max_tokens": 4,
}


async def test_a_message_whole_and_streamed_with_anthropics_usage(
    aiohttp_server: ServerFactory,
) -> None:
    worker = await start_worker(
        aiohttp_server, "--cost", "zero", "--num-blocks", "256", "--max-model-len", "2048"
    )
    async with aiohttp.ClientSession() as session:
        status, first = await worker.post(session, BODY, "/v1/messages")
        assert status == 200 and first["type"] == "message" and first["role"] == "assistant"
        assert first["stop_reason"] == STOP_REASONS["length"] == "max_tokens"
        assert first["content"][0]["type"] == "text"
        usage = first["usage"]
        assert usage["output_tokens"] == 4 and usage["cache_read_input_tokens"] == 0
        prompt = usage["input_tokens"]
        _, again = await worker.post(session, BODY, "/v1/messages")
        cached = again["usage"]["cache_read_input_tokens"]
        assert cached > 0 and again["usage"]["input_tokens"] + cached == prompt
        async with session.post(worker.url + "/v1/messages", json={**BODY, "stream": True}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            text = (await r.read()).decode()
    events = [block.split("\n", 1) for block in text.split("\n\n") if block]
    kinds = [name.removeprefix("event: ") for name, _ in events]
    assert kinds[:3] == ["message_start", "content_block_start", "ping"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) <= {"content_block_delta"}
    data = [json.loads(payload.removeprefix("data: ")) for _, payload in events]
    assert [d["type"] for d in data] == kinds  # each event's type repeats its name
    streamed = "".join(d["delta"]["text"] for d in data if d["type"] == "content_block_delta")
    assert streamed == first["content"][0]["text"]  # seeded by the prompt: the same text
    delta = data[-2]
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 4


async def test_refusals_are_anthropic_shaped(aiohttp_server: ServerFactory) -> None:
    worker = await start_worker(aiohttp_server, "--cost", "zero")
    image = {"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}
    cases = [
        ({k: v for k, v in BODY.items() if k != "max_tokens"}, 400, "max_tokens"),
        ({**BODY, "messages": [{"role": "user", "content": [image]}]}, 400, "not a text block"),
        ({**BODY, "messages": "hi"}, 400, "list of messages"),
        ({**BODY, "model": "nobody"}, 404, "nobody"),
        ({**BODY, "max_tokens": 10**6}, 400, "context length"),
    ]
    async with aiohttp.ClientSession() as session:
        for body, status, words in cases:
            got, answer = await worker.post(session, body, "/v1/messages")
            assert got == status, answer
            assert answer["type"] == "error" and words in answer["error"]["message"]
            expected = "not_found_error" if status == 404 else "invalid_request_error"
            assert answer["error"]["type"] == expected
        async with session.post(worker.url + "/v1/messages", data=b"{") as response:
            answer = await response.json()
        assert response.status == 400 and answer["error"]["type"] == "invalid_request_error"
