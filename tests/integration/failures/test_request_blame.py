"""No client can trip the breakers: request bodies are decoded as their
``Content-Encoding`` says (or refused), never forwarded with a header that no longer matches;
a 5xx that a second endpoint also returns for the same request is the request's fault."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable

import aiohttp
import orjson
from aiohttp import web

from loadtest.harness.processes import KvgateProcess
from tests.http_servers import serving
from tests.integration.metrics_util import scrape

BODY = {"model": "kvgate-sim", "prompt": "hello", "max_tokens": 1}
BREAKERS = (
    "breakers: {consecutive_failures: 2, cool_down: 30s}\nretries: {attempts: 2, backoff: 1ms}"
)


async def post(url: str, data: bytes, encoding: str | None) -> tuple[int, dict[str, object]]:
    headers = {"content-type": "application/json"}
    if encoding is not None:
        headers["content-encoding"] = encoding
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(f"{url}/v1/completions", data=data, headers=headers) as response,
    ):
        return response.status, orjson.loads(await response.read())


def open_breakers(url: str) -> list[str]:
    states = scrape(url).get("kvgate_breaker_state", [])  # a series once a breaker moved
    return [s.labels["endpoint"] for s in states if s.value != 0]


async def test_a_body_that_lies_about_its_encoding_trips_no_breaker(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backends = [start_backend("--cost", "zero").removeprefix("http://") for _ in range(2)]
    url, _ = start_gateway(f"""
pools: {{p: {{endpoints: [{", ".join(backends)}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
listen: {{max_body: 1MiB}}
{BREAKERS}
""")
    plain = orjson.dumps(BODY)
    for _ in range(6):  # says gzip, is not: refused by the gateway, never sent on
        status, body = await post(url, plain, "gzip")
        assert status == 400 and "not valid gzip" in str(body["error"]), body
    assert open_breakers(url) == []
    assert (await post(url, plain, None))[0] == 200
    # honest encodings are decoded and served; the backend gets plain JSON
    assert (await post(url, gzip.compress(plain), "gzip"))[0] == 200
    assert (await post(url, zlib.compress(plain), "deflate"))[0] == 200
    assert (await post(url, gzip.compress(gzip.compress(plain)), "gzip, gzip"))[0] == 200
    # a small body that decodes past max_body_bytes, and a coding nobody decodes here
    bomb = gzip.compress(b'{"model": "kvgate-sim", "prompt": "' + b"a" * (4 << 20) + b'"}')
    assert len(bomb) < 64 << 10
    status, body = await post(url, bomb, "gzip")
    assert status == 413 and body["error"]["code"] == "request_too_large"  # type: ignore[index]
    status, body = await post(url, plain, "compress")
    assert status == 415 and "gzip" in str(body["error"]), body
    assert open_breakers(url) == []


async def test_the_backend_answers_an_undecodable_body_with_400(
    start_backend: Callable[..., str],
) -> None:
    status, body = await post(start_backend("--cost", "zero"), orjson.dumps(BODY), "gzip")
    assert status == 400 and "request body" in str(body["error"]), body


def poisoned_backend() -> web.Application:
    """An OpenAI-ish upstream that fails (500) every request whose prompt says "poison"."""

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        if "poison" in str(body.get("prompt")):
            return web.json_response({"error": {"message": "boom"}}, status=500)
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return web.json_response({"choices": [{"text": "ok"}], "usage": usage})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


async def test_a_5xx_every_endpoint_returns_is_the_requests_fault(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    async with serving(poisoned_backend()) as one, serving(poisoned_backend()) as two:
        url, _ = start_gateway(f"""
pools: {{p: {{endpoints: [127.0.0.1:{one}, 127.0.0.1:{two}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
epp: {{picker: least-in-flight}}
{BREAKERS}
""")
        poison = orjson.dumps({**BODY, "prompt": "poison"})
        for _ in range(8):
            assert (await post(url, poison, None))[0] == 500  # the upstream's own answer
        assert open_breakers(url) == []  # both endpoints failed it: not their fault
        retried = sum(s.value for s in scrape(url).get("kvgate_retries_total", []))
        assert retried == 8  # one retry each, to find out; not the whole budget
        assert (await post(url, orjson.dumps(BODY), None))[0] == 200
