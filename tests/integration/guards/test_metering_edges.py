"""Metering at the edges, through a real gateway: a client that disconnects still pays for what
the engine generated for it (an OpenAI stream from its token ids, exactly what the engine
counted; a Messages stream cut before its final usage keeps what its budget reserved), the
aborted engine stops; a refused request costs nothing; a cached answer says what the budget
has left; a client that closes at ``[DONE]`` got a whole answer, metered and kept, whatever the
engine's last bytes do."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable

import aiohttp

from loadtest.harness.processes import KvgateProcess
from tests.http_servers import serving, streaming_app
from tests.integration.metrics_util import scrape

Start = Callable[..., tuple[str, KvgateProcess]]
KEY = "sk-metering"
SLOW = ("--cost", "0.02,0,0,0")  # 20 ms a step


def policy(endpoint: str, budget: float = 1000.0, route: str = "") -> str:
    """Output priced at one unit a token (prompts free): spend is generated tokens."""
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    return f"""
auth: {{api_keys: [{{sha256: {digest}, tenant: acme}}]}}
pools: {{p: {{endpoints: [{endpoint}]}}}}
routes: [{{model: kvgate-sim, pool: p{route}}}]
epp: {{picker: least-in-flight}}
timeouts: {{first_byte: 5s, idle: 5s}}
spend:
  prices: {{kvgate-sim: {{input: 0, output: 1000000}}}}
  budgets: [{{tenant: acme, per: day, limit: {budget}}}]
"""


HEADERS = {"authorization": f"Bearer {KEY}"}


def total(url: str, name: str, **labels: str) -> float:
    samples = scrape(url).get(name, [])
    return sum(s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items()))


async def read_then_leave(url: str, path: str, body: dict[str, object], events: int) -> None:
    """Read ``events`` data lines of a stream, then drop the connection."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}{path}", json=body, headers=HEADERS) as response,
    ):
        assert response.status == 200
        seen = 0
        async for line in response.content:
            seen += line.startswith(b"data:")
            if seen >= events:
                break
        response.close()


async def settled(url: str, backend: str) -> tuple[float, float]:
    """(the gateway's spend, the engine's generated tokens) once both stop moving."""
    last = (-1.0, -1.0)
    for _ in range(40):
        await asyncio.sleep(0.25)
        now = (
            total(url, "kvgate_spend_total"),
            total(backend, "vllm:generation_tokens_total"),
        )
        if now == last:
            return now
        last = now
    return last


async def test_a_client_that_leaves_a_stream_pays_for_what_the_engine_generated(
    start_backend: Callable[..., str], start_gateway: Start
) -> None:
    backend = start_backend(*SLOW)
    url, _ = start_gateway(policy(backend.removeprefix("http://")))
    for number in range(6):
        body = {
            "model": "kvgate-sim",
            "messages": [{"role": "user", "content": f"a long story {number}"}],
            "max_tokens": 60,
            "ignore_eos": True,
            "stream": True,
        }
        await read_then_leave(url, "/v1/chat/completions", body, 4 + number)
    spend, generated = await settled(url, backend)
    assert 0 < generated < 6 * 60  # each engine stopped when its client left
    assert total(backend, "vllm:num_requests_running") == 0
    assert spend == generated  # what the engine generated, billed: not 0, not the reservation
    assert total(url, "kvgate_requests_total", status="499") == 6


async def test_a_message_stream_cut_before_its_usage_keeps_its_reservation(
    start_backend: Callable[..., str], start_gateway: Start
) -> None:
    backend = start_backend(*SLOW)
    url, _ = start_gateway(policy(backend.removeprefix("http://")))
    body = {
        "model": "kvgate-sim",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "hello"}],
        "stream": True,
    }
    await read_then_leave(url, "/v1/messages", body, 5)
    spend, generated = await settled(url, backend)
    assert 0 < generated < 50
    assert spend == 50  # no count of its own: billed what it reserved, never its input alone


async def test_a_refused_request_costs_nothing(
    start_backend: Callable[..., str], start_gateway: Start
) -> None:
    backend = start_backend("--cost", "zero", "--max-model-len", "64")
    url, _ = start_gateway(policy(backend.removeprefix("http://"), budget=100.0))
    async with aiohttp.ClientSession() as session:
        long = {"model": "kvgate-sim", "prompt": "x" * 200, "max_tokens": 40}
        async with session.post(f"{url}/v1/completions", json=long, headers=HEADERS) as refused:
            assert refused.status == 400  # the engine's: the prompt does not fit its context
            assert refused.headers["x-kvgate-spend-remaining"] == "60.000000"  # 40 reserved
        short = {"model": "kvgate-sim", "prompt": "hi", "max_tokens": 1}
        async with session.post(f"{url}/v1/completions", json=short, headers=HEADERS) as answer:
            assert answer.status == 200
            # the refusal's 40 came back: 100 less this request's own reservation
            assert answer.headers["x-kvgate-spend-remaining"] == "99.000000"
    assert total(url, "kvgate_spend_total") == 1


async def test_a_cached_answer_says_what_the_budget_has_left(
    start_backend: Callable[..., str], start_gateway: Start
) -> None:
    backend = start_backend("--cost", "zero")
    url, _ = start_gateway(policy(backend.removeprefix("http://"), route=", cache: true"))
    body = {"model": "kvgate-sim", "prompt": "kept", "max_tokens": 4, "temperature": 0}
    said = []
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            async with session.post(f"{url}/v1/completions", json=body, headers=HEADERS) as answer:
                await answer.read()
                said.append((answer.headers["x-kvgate-cache"], answer.headers))
            await asyncio.sleep(0.3)
    (miss, _), (hit, headers) = said
    assert (miss, hit) == ("miss", "hit")
    assert headers["x-kvgate-spend-remaining"] == f"{1000 - 4:.6f}"


def events_then_a_late_end() -> list[bytes]:
    """A whole stream with its usage and ``[DONE]``; the engine ends its body 50 ms later."""
    chunk = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "ok"}]}
    usage = {"id": "c", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}}
    return [
        b"data: " + json.dumps(chunk).encode() + b"\n\n",
        b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n",
    ]


async def test_a_client_that_closes_at_done_got_a_whole_answer(start_gateway: Start) -> None:
    app = streaming_app(events_then_a_late_end, stall=0.05)
    async with serving(app) as port:
        url, _ = start_gateway(policy(f"127.0.0.1:{port}", route=", cache: true"))
        body = {"model": "kvgate-sim", "prompt": "p", "max_tokens": 3, "temperature": 0}
        for _ in range(2):
            await read_then_leave(url, "/v1/completions", {**body, "stream": True}, 3)
            await asyncio.sleep(0.3)
    assert total(url, "kvgate_requests_total", status="200") == 2
    assert total(url, "kvgate_requests_total", status="499") == 0
    assert total(url, "kvgate_response_cache_lookups_total", result="hit") == 1
    assert total(url, "kvgate_spend_total") == 3  # the first; the second was the cache's
    assert total(url, "kvgate_tokens_total", direction="completion") == 3
