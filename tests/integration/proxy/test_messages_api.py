"""Anthropic's Messages API (``/v1/messages``) through the gateway with the official
``anthropic`` client: whole and streamed, routed on the system prompt (the prefix cache of the
endpoint that served it is found again), metered and limited like chat completions, every
refusal in Anthropic's error shape, and a stream cut before ``message_stop`` ended with
Anthropic's ``error`` event."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import aiohttp
import anthropic
import pytest

from loadtest.harness.processes import KvgateProcess
from tests.fakes import close_after_test
from tests.http_servers import started
from tests.integration.metrics_util import scrape

KEY = "sk-messages-acme"
GREEDY = {"temperature": 0}  # vLLM's field; the client library no longer names it
SYSTEM = "You are the assistant of a shipping company. " * 40  # shared: worth many blocks


def policy(endpoints: list[str], limits: str = "", idle: str = "10s", cache: bool = False) -> str:
    sha = hashlib.sha256(KEY.encode()).hexdigest()
    return f"""
pools: {{p: {{endpoints: [{", ".join(endpoints)}]}}}}
routes: [{{model: kvgate-sim, pool: p, cache: {str(cache).lower()}}}]
auth: {{api_keys: [{{sha256: {sha}, tenant: acme}}]}}
timeouts: {{connect: 1s, first_byte: 10s, idle: {idle}}}
{limits}
"""


def client(url: str, key: str = KEY) -> anthropic.Anthropic:
    return close_after_test(anthropic.Anthropic(base_url=url, api_key=key, max_retries=0))


def post(url: str, data: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"{url}/v1/messages", data, {"x-api-key": KEY})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_messages_are_answered_whole_and_streamed_routed_and_metered(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backends = [start_backend("--cost", "zero").removeprefix("http://") for _ in range(3)]
    url, _ = start_gateway(policy(backends))
    acme = client(url)
    made = [
        acme.messages.create(
            model="kvgate-sim",
            system=SYSTEM,
            messages=[{"role": "user", "content": f"Where is parcel {number}?"}],
            max_tokens=6,
        )
        for number in range(6)
    ]
    for message in made:
        assert message.type == "message" and message.role == "assistant"
        assert message.model == "kvgate-sim" and message.stop_reason == "max_tokens"
        assert message.content[0].type == "text" and message.content[0].text
        assert message.usage.output_tokens == 6
    # routed on the system prompt: after the first, each finds it in its endpoint's cache
    for message in made[1:]:
        assert (message.usage.cache_read_input_tokens or 0) >= 256

    with acme.messages.stream(
        model="kvgate-sim",
        system=[{"type": "text", "text": SYSTEM}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Stream it."}]}],
        max_tokens=5,
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5
    assert (final.usage.cache_read_input_tokens or 0) >= 256  # blocks as text, routed alike

    answers = [*made, final]
    prompt = sum(
        m.usage.input_tokens
        + (m.usage.cache_read_input_tokens or 0)
        + (m.usage.cache_creation_input_tokens or 0)
        for m in answers
    )
    tokens = scrape(url)["kvgate_tokens_total"]
    metered = {s.labels["direction"]: s.value for s in tokens}
    assert metered["prompt"] == prompt  # the whole prompt, cached or not
    assert metered["completion"] == sum(m.usage.output_tokens for m in answers)
    requests = scrape(url)["kvgate_requests_total"]
    assert sum(s.value for s in requests if s.labels["route"] == "/v1/messages") == 7


def test_a_greedy_message_is_answered_again_from_the_cache_whole_and_streamed(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    url, _ = start_gateway(policy([start_backend().removeprefix("http://")], cache=True))
    acme = client(url)
    hello: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hello"}]
    said = []
    for _ in range(2):
        raw = acme.messages.with_raw_response.create(
            model="kvgate-sim", messages=hello, max_tokens=5, extra_body=GREEDY
        )
        said.append((raw.headers["x-kvgate-cache"], raw.parse().content))
    assert [cache for cache, _ in said] == ["miss", "hit"] and said[0][1] == said[1][1]
    streamed = []
    for _ in range(2):
        with acme.messages.stream(
            model="kvgate-sim", messages=hello, max_tokens=5, extra_body=GREEDY
        ) as stream:
            cache = stream.response.headers["x-kvgate-cache"]
            streamed.append((cache, "".join(stream.text_stream), stream.get_final_message().usage))
    assert [cache for cache, _, _ in streamed] == ["miss", "hit"]
    assert streamed[0][1:] == streamed[1][1:]  # the same events, replayed
    sampled = acme.messages.with_raw_response.create(
        model="kvgate-sim", messages=hello, max_tokens=5
    )
    assert sampled.headers["x-kvgate-cache"] == "bypass"  # temperature 1: not deterministic


def test_refusals_are_anthropic_shaped(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    limits = 'limits: {default_max_tokens: 16, rules: [{name: tpm, match: {tenant: "*"}, tokens_per_min: 300}]}'
    url, _ = start_gateway(policy([backend], limits))
    acme = client(url)
    hello: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hello"}]

    def refusal(status: int, error_type: str, call: Callable[[], object]) -> str:
        with pytest.raises(anthropic.APIStatusError) as caught:
            call()
        assert caught.value.status_code == status
        body = caught.value.body
        assert isinstance(body, dict) and body["type"] == "error"
        assert body["error"]["type"] == error_type
        return str(body["error"]["message"])

    refusal(
        401,
        "authentication_error",
        lambda: client(url, "sk-wrong").messages.create(
            model="kvgate-sim", messages=hello, max_tokens=4
        ),
    )
    message = refusal(
        404,
        "not_found_error",
        lambda: acme.messages.create(model="no-such-model", messages=hello, max_tokens=4),
    )
    assert "no-such-model" in message
    source: anthropic.types.Base64ImageSourceParam = {
        "type": "base64",
        "media_type": "image/png",
        "data": "x",
    }
    image: list[anthropic.types.MessageParam] = [
        {"role": "user", "content": [{"type": "image", "source": source}]}
    ]
    message = refusal(
        400,
        "invalid_request_error",  # the backend's own refusal, passed on
        lambda: acme.messages.create(model="kvgate-sim", messages=image, max_tokens=4),
    )
    assert "messages[0].content[0]" in message
    # what the client library would not send: no max_tokens, a body that is not JSON
    status, body = post(url, json.dumps({"model": "kvgate-sim", "messages": hello}).encode())
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    status, body = post(url, b"{")
    assert status == 400 and body == {"type": "error", "error": body["error"]}
    assert body["error"]["type"] == "invalid_request_error"
    # the token limit reserves a message's max_tokens as it does a chat completion's
    acme.messages.create(model="kvgate-sim", messages=hello, max_tokens=200)
    refusal(
        429,
        "rate_limit_error",
        lambda: acme.messages.create(model="kvgate-sim", messages=hello, max_tokens=200),
    )


async def test_a_message_stream_cut_before_its_end_gets_an_error_event(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    start = {"type": "message_start", "message": {"id": "msg_cut", "usage": {"input_tokens": 3}}}
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    first = f"event: message_start\ndata: {json.dumps(start)}\n\n".encode()
    chunk = b"%x\r\n%b\r\n" % (len(first), first)
    upstream, server = await started(lambda _: head + chunk)  # and then nothing more
    async with server:
        url, _ = start_gateway(policy([f"127.0.0.1:{upstream.port}"], idle="1s"))
        body = {"model": "kvgate-sim", "messages": [], "max_tokens": 4, "stream": True}
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/v1/messages", json=body, headers={"x-api-key": KEY}) as response,
        ):
            assert response.status == 200
            text = (await response.read()).decode()
    events = [e for e in text.split("\n\n") if e]
    assert events[0].startswith("event: message_start")
    name, data = events[-1].split("\n")
    assert name == "event: error"
    error = json.loads(data.removeprefix("data: "))
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    assert "stalled" in error["error"]["message"]
