"""A stream whose engine dies mid-answer goes on from another engine, in the same stream: real
gateway and simulated backends, the serving one SIGKILLed after some tokens. The simulated
runner's tokens depend on the request's seed and their position only, so the joined answer must
equal the uninterrupted one exactly."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from loadtest.harness.processes import KvgateProcess, backend_process, free_port

SLOW = ("--cost", "0.02,0,0,0")  # 20 ms a step: a 30-token answer takes 0.6 s
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.fixture
def engines() -> Iterator[Callable[[int], list[tuple[int, KvgateProcess]]]]:
    started: list[KvgateProcess] = []

    def start(count: int) -> list[tuple[int, KvgateProcess]]:
        ports = [free_port() for _ in range(count)]
        for port in ports:
            started.append(backend_process(port, *SLOW).start())
        return list(zip(ports, started[-count:], strict=True))

    yield start
    for proc in started:
        proc.stop()


def _policy(ports: list[int], extra: str = "", route: str = "") -> str:
    endpoints = ", ".join(f"127.0.0.1:{p}" for p in ports)
    return f"pools: {{p: {{endpoints: [{endpoints}]{extra}}}}}\nroutes: [{{model: kvgate-sim, pool: p{route}}}]\n"


def _body(path: str, **extra: object) -> dict[str, object]:
    body: dict[str, object] = {
        "model": "kvgate-sim",
        "max_tokens": 30,
        "seed": 7,
        "ignore_eos": True,
    }
    if path == CHAT:
        body["messages"] = [{"role": "user", "content": "tell me a long story"}]
    else:
        body["prompt"] = "tell me a long story"
    return {**body, **extra}


async def _events(
    session: aiohttp.ClientSession, url: str, body: dict[str, object]
) -> AsyncIterator[str]:
    async with session.post(url, json={**body, "stream": True}) as response:
        assert response.status == 200
        async for line in response.content:
            text = line.decode().strip()
            if text.startswith("data:"):
                yield text[5:].strip()


def _text(events: list[str]) -> str:
    out = ""
    for event in events:
        if event == "[DONE]":
            continue
        for choice in json.loads(event).get("choices", []):
            out += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
    return out


def _serving(engines: list[tuple[int, KvgateProcess]]) -> KvgateProcess:
    """The engine with a request running (read off its /metrics)."""
    for port, proc in engines:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("vllm:num_requests_running") and float(line.split()[-1]) > 0:
                    return proc
    raise AssertionError("no engine is serving the stream")


async def _broken_run(
    url: str,
    path: str,
    body: dict[str, object],
    engines: list[tuple[int, KvgateProcess]],
    kills: int = 1,
) -> list[str]:
    """The stream's events through the gateway, the serving engine killed after every eighth
    content event, ``kills`` times."""
    got: list[str] = []
    async with aiohttp.ClientSession() as session:
        async for event in _events(session, url + path, body):
            got.append(event)
            if kills and len(got) % 8 == 0:
                _serving([e for e in engines if e[1].proc and e[1].proc.poll() is None]).kill()
                kills -= 1
    return got


async def _uninterrupted(port: int, path: str, body: dict[str, object]) -> list[str]:
    async with aiohttp.ClientSession() as session:
        return [e async for e in _events(session, f"http://127.0.0.1:{port}{path}", body)]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("token_ids", [True, False], ids=["from-token-ids", "from-text"])
async def test_a_stream_goes_on_from_another_engine_when_its_engine_dies(
    engines: Callable[[int], list[tuple[int, KvgateProcess]]],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    path: str,
    token_ids: bool,
) -> None:
    running = engines(2)
    extra = "" if token_ids else ", token_ids: false"
    url, _ = start_gateway(_policy([p for p, _ in running], extra))
    body = _body(path, stream_options={"include_usage": True})
    expected = await _uninterrupted(running[0][0], path, body)
    got = await _broken_run(url, path, body, running)
    assert got[-1] == "[DONE]" and not any('"error"' in e for e in got)
    assert _text(got) == _text(expected) and len(_text(got)) == 30
    chunks = [json.loads(e) for e in got[:-1]]
    assert len({c["id"] for c in chunks}) == 1  # one stream, one id
    usages = [c["usage"] for c in chunks if c.get("usage")]
    want = json.loads(expected[-2])["usage"]
    assert len(usages) == 1 and usages[0]["prompt_tokens"] == want["prompt_tokens"]
    assert usages[0]["completion_tokens"] == 30
    assert not any("token_ids" in e for e in got)  # the gateway's own ask is not passed on


async def test_a_stream_survives_two_dead_engines_and_keeps_the_client_s_token_ids(
    engines: Callable[[int], list[tuple[int, KvgateProcess]]],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    running = engines(3)
    url, _ = start_gateway(_policy([p for p, _ in running]))
    body = _body(CHAT, return_token_ids=True)  # no usage asked: none is sent
    expected = await _uninterrupted(running[0][0], CHAT, body)
    got = await _broken_run(url, CHAT, body, running, kills=2)
    assert got[-1] == "[DONE]" and _text(got) == _text(expected)
    chunks = [json.loads(e) for e in got[:-1]]
    assert not any(c.get("usage") for c in chunks)
    ids = [t for c in chunks for choice in c["choices"] for t in choice.get("token_ids") or []]
    want = [
        t
        for e in expected[:-1]
        for ch in json.loads(e)["choices"]
        for t in ch.get("token_ids") or []
    ]
    assert ids == want and len(ids) == 30
    assert "prompt_token_ids" in chunks[0] and not any("prompt_token_ids" in c for c in chunks[1:])


async def test_a_route_without_resume_ends_the_stream_with_an_error_event(
    engines: Callable[[int], list[tuple[int, KvgateProcess]]],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    running = engines(2)
    url, _ = start_gateway(_policy([p for p, _ in running], route=", resume: false"))
    got = await _broken_run(url, CHAT, _body(CHAT), running)
    assert got[-1] != "[DONE]" and '"upstream_stream_broken"' in got[-1]


async def test_an_answer_whose_engine_died_before_answering_is_sent_again(
    engines: Callable[[int], list[tuple[int, KvgateProcess]]],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    tmp_path: Path,
) -> None:
    """Not streamed: nothing reached the client, the whole request goes to another engine."""
    running = engines(2)
    url, _ = start_gateway(_policy([p for p, _ in running]))
    async with aiohttp.ClientSession() as session:
        request = asyncio.ensure_future(session.post(f"{url}{CHAT}", json=_body(CHAT)).__aenter__())
        await asyncio.sleep(0.2)
        _serving(running).kill()
        response = await request
        answer = await response.json()
        response.release()
    assert response.status == 200 and len(answer["choices"][0]["message"]["content"]) == 30


async def test_a_stream_broken_before_its_first_event_is_sent_again_elsewhere(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    """Nothing reached the client: the same request goes to another endpoint, whose stream is
    relayed as it is (with its own id)."""
    from aiohttp import web

    from tests.http_servers import serving

    served: list[int] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        served.append(request.url.port or 0)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if len(served) == 1:  # the first try: the head, then the engine is gone
            assert request.transport is not None
            request.transport.close()
            return response
        for text in ("a", "b"):
            event = {
                "id": "cmpl-2",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "text": text}],
            }
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    def app() -> web.Application:
        application = web.Application()
        application.router.add_post(COMPLETIONS, completions)
        return application

    async with serving(app()) as first, serving(app()) as second:
        url, _ = start_gateway(_policy([first, second]))
        async with aiohttp.ClientSession() as session:
            got = [e async for e in _events(session, url + COMPLETIONS, _body(COMPLETIONS))]
    assert got[-1] == "[DONE]" and _text(got) == "ab" and len(set(served)) == 2


async def test_a_prompt_sent_as_token_ids_goes_on_from_another_engine_when_its_engine_dies(
    engines: Callable[[int], list[tuple[int, KvgateProcess]]],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    """A pool sent the precise index's token ids instead of the text: its broken stream goes
    on elsewhere all the same, the joined answer the uninterrupted one's."""
    running = engines(2)
    precise = (
        "epp: {plugins: [{name: prefix, type: prefix-cache-scorer, params: {mode: precise}}, "
        "{name: pick, type: max-score-picker}], "
        "profiles: [{name: default, plugins: [{ref: prefix}, {ref: pick}]}]}\n"
    )
    policy = _policy([p for p, _ in running], ", tokenized_prompts: true") + precise
    url, _ = start_gateway(policy)
    body = _body(COMPLETIONS, stream_options={"include_usage": True})
    expected = await _uninterrupted(running[0][0], COMPLETIONS, body)
    got = await _broken_run(url, COMPLETIONS, body, running)
    assert got[-1] == "[DONE]" and not any('"error"' in e for e in got)
    assert _text(got) == _text(expected) and len(_text(got)) == 30
    usages = [json.loads(e)["usage"] for e in got[:-1] if json.loads(e).get("usage")]
    want = json.loads(expected[-2])["usage"]
    assert len(usages) == 1 and usages[0]["prompt_tokens"] == want["prompt_tokens"]
