"""The response cache through a real gateway: a repeated deterministic request is answered
without reaching the engine (a stream as the same events, read by the official client), never
for another tenant, never when the caller or the sampling says not, never from a partial or
failed answer; replicas sharing Redis find each other's answers, and a dead Redis costs only
misses."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Iterator

import aiohttp
import openai
import orjson
import pytest

from loadtest.harness.processes import KvgateProcess
from loadtest.harness.redis_server import RedisServer
from tests.http_servers import serving, streaming_app
from tests.integration.metrics_util import scrape

ACME, BETA = "sk-cache-acme", "sk-cache-beta"
GREEDY = {"model": "kvgate-sim", "prompt": "kept answers", "max_tokens": 8, "temperature": 0}

Start = Callable[..., tuple[str, KvgateProcess]]


def policy(endpoint: str, extra: str = "", cache: str = "true") -> str:
    keys = "".join(
        f"\n    - {{sha256: {hashlib.sha256(key.encode()).hexdigest()}, tenant: {tenant}}}"
        for key, tenant in ((ACME, "acme"), (BETA, "beta"))
    )
    return f"""
auth:
  api_keys:{keys}
pools: {{p: {{endpoints: [{endpoint}]}}}}
routes: [{{model: kvgate-sim, pool: p, cache: {cache}}}]
epp: {{picker: least-in-flight}}
{extra}
"""


@pytest.fixture
def backend(start_backend: Callable[..., str]) -> str:
    return start_backend("--cost", "zero")


def served(backend: str) -> float:
    """Requests the engine finished."""
    return sum(s.value for s in scrape(backend).get("vllm:request_success_total", []))


def lookups(url: str, result: str) -> float:
    samples = scrape(url).get("kvgate_response_cache_lookups_total", [])
    return sum(s.value for s in samples if s.labels["result"] == result)


async def post(
    url: str, body: dict[str, object], key: str = ACME, **headers: str
) -> tuple[int, str, bytes, dict[str, str]]:
    """(status, x-kvgate-cache, body, headers) of one completion."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/v1/completions",
            json=body,
            headers={"authorization": f"Bearer {key}", **headers},
        ) as response,
    ):
        data = await response.read()
        return (
            response.status,
            response.headers.get("x-kvgate-cache", ""),
            data,
            {k.lower(): v for k, v in response.headers.items()},
        )


async def test_a_repeated_greedy_request_is_answered_from_the_cache(
    backend: str, start_gateway: Start
) -> None:
    url, _ = start_gateway(policy(backend.removeprefix("http://")))
    status, verdict, first, _ = await post(url, GREEDY)
    assert (status, verdict) == (200, "miss")
    status, verdict, again, headers = await post(url, {**GREEDY, "max_tokens": 8})
    assert (status, verdict, again) == (200, "hit", first)
    assert headers["content-type"] == "application/json" and int(headers["age"]) >= 0
    assert headers["x-request-id"]
    assert served(backend) == 1
    assert (lookups(url, "hit"), lookups(url, "miss")) == (1, 1)


async def test_a_stream_is_replayed_as_the_same_events(backend: str, start_gateway: Start) -> None:
    url, _ = start_gateway(policy(backend.removeprefix("http://")))
    seeded = {**GREEDY, "temperature": 0.9, "seed": 7, "stream": True}
    _, verdict, first, _ = await post(url, seeded)
    _, replayed, again, headers = await post(url, seeded)
    assert (verdict, replayed, again) == ("miss", "hit", first)
    assert first.endswith(b"data: [DONE]\n\n") and headers["content-type"] == "text/event-stream"
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=ACME, max_retries=0)
    stream = await client.completions.create(
        model="kvgate-sim",
        prompt="kept answers",
        max_tokens=8,
        temperature=0.9,
        seed=7,
        stream=True,
    )
    text = "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])
    await client.close()
    assert text and text == text_of(first)
    assert served(backend) == 1 and lookups(url, "hit") == 2


def text_of(stream: bytes) -> str:
    """The completion text of a raw SSE body."""
    events = [e.removeprefix(b"data: ") for e in stream.split(b"\n\n") if e.strip()]
    chunks = [orjson.loads(e) for e in events if e != b"[DONE]"]
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


async def test_no_answer_is_found_by_another_tenant(backend: str, start_gateway: Start) -> None:
    url, _ = start_gateway(policy(backend.removeprefix("http://")))
    verdicts = [(await post(url, GREEDY, key))[1] for key in (ACME, BETA, BETA, ACME)]
    assert verdicts == ["miss", "miss", "hit", "hit"]
    assert served(backend) == 2


async def test_a_route_may_share_answers_across_tenants(backend: str, start_gateway: Start) -> None:
    url, _ = start_gateway(policy(backend.removeprefix("http://"), cache="{across_tenants: true}"))
    verdicts = [(await post(url, GREEDY, key))[1] for key in (ACME, BETA)]
    assert verdicts == ["miss", "hit"] and served(backend) == 1


async def test_sampled_answers_and_the_callers_directives_are_respected(
    backend: str, start_gateway: Start
) -> None:
    url, _ = start_gateway(policy(backend.removeprefix("http://")))
    sampled = {**GREEDY, "temperature": 0.7}
    assert [(await post(url, sampled))[1] for _ in range(2)] == ["bypass", "bypass"]
    assert (await post(url, GREEDY, **{"cache-control": "no-store"}))[1] == "bypass"
    assert (await post(url, GREEDY))[1] == "miss"  # no-store kept nothing
    assert (await post(url, GREEDY, **{"cache-control": "no-cache"}))[1] == "miss"
    assert (await post(url, GREEDY))[1] == "hit"
    assert served(backend) == 5


class Broken:
    """An upstream whose stream ends without ``[DONE]``, counting the requests it got."""

    def __init__(self) -> None:
        self.requests = 0

    def parts(self) -> list[bytes]:
        self.requests += 1
        return [b'data: {"choices":[{"index":0,"text":"half"}]}\n\n']


@pytest.fixture
async def broken() -> AsyncIterator[tuple[str, Broken]]:
    upstream = Broken()
    async with serving(streaming_app(upstream.parts)) as port:
        yield f"127.0.0.1:{port}", upstream


async def test_a_broken_stream_is_not_kept(
    broken: tuple[str, Broken], start_gateway: Start
) -> None:
    endpoint, upstream = broken
    url, _ = start_gateway(policy(endpoint, "retries: {resumes: 0}"))
    for _ in range(2):
        status, verdict, data, _ = await post(url, {**GREEDY, "stream": True})
        assert (status, verdict) == (200, "miss") and b"upstream_stream_broken" in data
    assert upstream.requests == 2


async def test_refusals_and_answers_over_the_entry_size_are_not_kept(
    backend: str, start_gateway: Start
) -> None:
    url, _ = start_gateway(
        policy(backend.removeprefix("http://"), "response_cache: {max_entry: 400}")
    )
    refused = {**GREEDY, "n": 0}  # the engine refuses it: a 400
    assert [(await post(url, refused))[0] for _ in range(2)] == [400, 400]
    long = {**GREEDY, "max_tokens": 256}
    assert [(await post(url, long))[1] for _ in range(2)] == ["miss", "miss"]
    assert [(await post(url, GREEDY))[1] for _ in range(2)] == ["miss", "hit"]
    assert served(backend) == 3  # the refusals never reached a sequence


@pytest.fixture
def shared(redis_server: RedisServer, backend: str) -> Iterator[str]:
    yield policy(
        backend.removeprefix("http://"),
        f"response_cache: {{store: redis, url: '{redis_server.url}', timeout: 200ms}}",
    )


async def test_replicas_sharing_redis_find_each_others_answers(
    shared: str, backend: str, redis_server: RedisServer, start_gateway: Start
) -> None:
    first, _ = start_gateway(shared)
    second, _ = start_gateway(shared)
    assert (await post(first, GREEDY))[1] == "miss"
    _, verdict, data, _ = await post(second, GREEDY)
    assert verdict == "hit" and served(backend) == 1
    redis_server.stop()
    other = {**GREEDY, "prompt": "while redis is away"}
    outcomes = [(await post(second, other))[:2] for _ in range(3)]
    # the memory store still answers what this replica kept itself
    assert outcomes == [(200, "miss"), (200, "hit"), (200, "hit")]
    errors = scrape(second)["kvgate_response_cache_store_errors_total"][0].value
    assert errors >= 1 and data
