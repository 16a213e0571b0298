"""CORS: a browser's preflight is answered before authentication, and the
allowed origin's responses (whole, streamed, errors) carry what lets the page read them."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import aiohttp

from loadtest.harness.processes import KvgateProcess

KEY = "sk-cors-test"
APP = "https://app.example.com"


def policy(backend: str, cors: str) -> str:
    return f"""
{cors}
pools: {{p: {{endpoints: [{backend}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
auth: {{api_keys: [{{sha256: {hashlib.sha256(KEY.encode()).hexdigest()}, tenant: t}}]}}
"""


PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
}


async def test_cors_preflight_and_responses(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    url, _ = start_gateway(policy(backend, f"cors: {{origins: [{APP!r}], max_age: 1m}}"))
    body = {"model": "kvgate-sim", "prompt": "hi", "max_tokens": 2}
    auth = {"Authorization": f"Bearer {KEY}", "Origin": APP}
    async with aiohttp.ClientSession() as session:
        async with session.options(
            f"{url}/v1/completions", headers={**PREFLIGHT, "Origin": APP}
        ) as r:
            assert r.status == 204
            assert r.headers["access-control-allow-origin"] == APP
            assert (
                r.headers["access-control-allow-headers"]
                == PREFLIGHT["Access-Control-Request-Headers"]
            )
            assert "POST" in r.headers["access-control-allow-methods"]
            assert r.headers["access-control-max-age"] == "60"
        async with session.options(
            f"{url}/v1/completions", headers={**PREFLIGHT, "Origin": "https://evil.example"}
        ) as r:
            assert r.status == 403 and "access-control-allow-origin" not in r.headers
        for stream in (False, True):
            async with session.post(
                f"{url}/v1/completions", json={**body, "stream": stream}, headers=auth
            ) as r:
                assert r.status == 200
                assert r.headers["access-control-allow-origin"] == APP
                assert "x-request-id" in r.headers["access-control-expose-headers"]
                await r.read()
        async with session.post(
            f"{url}/v1/completions",
            json=body,
            headers={"Origin": APP},  # no key: a 401
        ) as r:
            assert r.status == 401 and r.headers["access-control-allow-origin"] == APP
        async with session.post(
            f"{url}/v1/completions", json=body, headers={**auth, "Origin": "https://evil.example"}
        ) as r:
            assert r.status == 200 and "access-control-allow-origin" not in r.headers


async def test_without_a_cors_section_a_preflight_is_just_unauthenticated(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    url, _ = start_gateway(policy(backend, ""))
    async with (
        aiohttp.ClientSession() as session,
        session.options(f"{url}/v1/completions", headers={**PREFLIGHT, "Origin": APP}) as r,
    ):
        assert r.status == 401 and "access-control-allow-origin" not in r.headers
