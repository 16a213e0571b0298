"""An engine that fails in its own way, mid-stream: vLLM ends the stream with an error event
(its ``ErrorResponse`` as an event's data) and then ``[DONE]``, Anthropic's API with an
``error`` event. Through a real gateway, read by the official clients: such a stream is a
broken one — continued elsewhere where it can be (the client never sees the engine's error),
otherwise ended with the gateway's error event; never kept by the response cache; counted as
a failure (502) in the request metrics."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import anthropic
import openai
import pytest
from aiohttp import web

from loadtest.harness.processes import KvgateProcess
from tests.http_servers import serving
from tests.integration.metrics_util import scrape

Start = Callable[..., tuple[str, KvgateProcess]]
Script = Callable[[dict[str, object]], list[bytes]]

VLLM_ERROR = (
    b'data: {"error": {"message": "EngineCore encountered an issue. See stack trace (above) '
    b'for the root cause.", "type": "InternalServerError", "param": null, "code": 500}}\n\n'
)
DONE = b"data: [DONE]\n\n"


def chunk(text: str, reason: str | None = None) -> bytes:
    data = {
        "id": "chatcmpl-e",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": reason}],
    }
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def usage(prompt: int, completion: int) -> bytes:
    counts = {"prompt_tokens": prompt, "completion_tokens": completion}
    data = {"id": "chatcmpl-e", "object": "chat.completion.chunk", "choices": [], "usage": counts}
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def failing_in_band(body: dict[str, object]) -> list[bytes]:
    return [chunk("Once"), chunk(" upon"), VLLM_ERROR, DONE]


def the_rest(body: dict[str, object]) -> list[bytes]:
    messages = body["messages"]
    assert isinstance(messages, list) and messages[-1]["content"] == "Once upon"
    return [chunk(" a time", "stop"), usage(9, 4), DONE]


def anthropic_event(kind: str, **fields: object) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


def overloaded(body: dict[str, object]) -> list[bytes]:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
               "content": [], "usage": {"input_tokens": 5, "output_tokens": 0}}  # fmt: skip
    return [
        anthropic_event("message_start", message=message),
        anthropic_event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        anthropic_event("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"}),
        anthropic_event("error", error={"type": "overloaded_error", "message": "Overloaded"}),
    ]


class Engine:
    """A scripted engine: each request takes the next script, whichever server gets it."""

    def __init__(self, *scripts: Script) -> None:
        self.scripts = list(scripts)
        self.served = 0

    def app(self) -> web.Application:
        async def stream(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            script = self.scripts[min(self.served, len(self.scripts) - 1)]
            self.served += 1
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for part in script(body):
                await response.write(part)
            return response

        app = web.Application()
        for path in ("/v1/chat/completions", "/v1/messages"):
            app.router.add_post(path, stream)
        return app


def policy(ports: list[int], route: str = "") -> str:
    endpoints = ", ".join(f"127.0.0.1:{p}" for p in ports)
    return f"""
pools: {{p: {{endpoints: [{endpoints}], token_ids: false}}}}
routes: [{{model: m, pool: p{route}}}]
timeouts: {{first_byte: 5s, idle: 5s}}
epp: {{picker: least-in-flight}}
"""


def requests_with_status(url: str, status: str) -> float:
    samples = scrape(url).get("kvgate_requests_total", [])
    return sum(s.value for s in samples if s.labels["status"] == status)


def counter(url: str, name: str, **labels: str) -> float:
    samples = scrape(url).get(name, [])
    return sum(s.value for s in samples if all(s.labels[k] == v for k, v in labels.items()))


@pytest.fixture
def greedy_chat() -> Iterator[dict[str, object]]:
    yield {
        "model": "m",
        "messages": [{"role": "user", "content": "a story"}],
        "max_tokens": 16,
        "temperature": 0,
    }


async def test_an_in_band_error_is_resumed_and_the_client_never_sees_it(
    start_gateway: Start, greedy_chat: dict[str, object]
) -> None:
    engine = Engine(failing_in_band, the_rest)
    async with serving(engine.app()) as first, serving(engine.app()) as second:
        url, _ = start_gateway(policy([first, second]))
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        stream = await client.chat.completions.create(**greedy_chat, stream=True)  # type: ignore[call-overload]
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        await client.close()
    assert text == "Once upon a time"
    assert engine.served == 2
    assert counter(url, "kvgate_stream_resumes_total", outcome="resumed") == 1
    assert requests_with_status(url, "200") == 1


async def test_an_in_band_error_that_cannot_be_resumed_fails_and_is_never_cached(
    start_gateway: Start, greedy_chat: dict[str, object]
) -> None:
    engine = Engine(failing_in_band)
    async with serving(engine.app()) as port:
        url, _ = start_gateway(policy([port], ", cache: true, resume: false"))
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        for _ in range(2):
            with pytest.raises(openai.APIError, match="EngineCore encountered an issue"):
                stream = await client.chat.completions.create(**greedy_chat, stream=True)  # type: ignore[call-overload]
                async for _chunk in stream:
                    pass
        await client.close()
    assert engine.served == 2  # the broken answer was not replayed
    assert counter(url, "kvgate_response_cache_lookups_total", result="hit") == 0
    assert requests_with_status(url, "502") == 2 and requests_with_status(url, "200") == 0


async def test_anthropic_s_error_event_fails_the_message_and_is_never_cached(
    start_gateway: Start,
) -> None:
    engine = Engine(overloaded)
    async with serving(engine.app()) as port:
        url, _ = start_gateway(policy([port], ", cache: true"))
        client = anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0)
        for _ in range(2):
            with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
                async with client.messages.stream(
                    model="m",
                    max_tokens=16,
                    messages=[{"role": "user", "content": "hi"}],
                    extra_body={"temperature": 0},
                ) as stream:
                    async for _event in stream:
                        pass
        await client.close()
    assert engine.served == 2
    assert counter(url, "kvgate_response_cache_lookups_total", result="hit") == 0
    assert requests_with_status(url, "502") == 2
