"""Extra upstream paths per route (OpenAI paths): ``routes[].paths`` passes e.g.
``/tokenize`` through to the model's pool unchanged — authenticated, and counted in the
gateway's metrics like the OpenAI paths; a path another route lists is refused for this one."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import aiohttp

from loadtest.harness.processes import KvgateProcess
from tests.integration.metrics_util import scrape

KEY = "sk-passthrough-test"


async def test_extra_paths_are_authenticated_routed_and_metered(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    url, _ = start_gateway(f"""
pools: {{p: {{endpoints: [{backend}]}}}}
routes:
  - {{model: kvgate-sim, pool: p, paths: [/tokenize, /detokenize]}}
  - {{model: other, pool: p}}
auth: {{api_keys: [{{sha256: {hashlib.sha256(KEY.encode()).hexdigest()}, tenant: t}}]}}
""")
    auth = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as session:
        body = {"model": "kvgate-sim", "prompt": "hello"}
        async with session.post(f"{url}/tokenize", json=body, headers=auth) as r:
            assert r.status == 200
            tokens = (await r.json())["tokens"]
        assert tokens == list(b"hello")  # the backend's byte tokenizer answered
        detok = {"model": "kvgate-sim", "tokens": tokens}
        async with session.post(f"{url}/detokenize", json=detok, headers=auth) as r:
            assert r.status == 200 and (await r.json())["prompt"] == "hello"
        async with session.post(f"{url}/tokenize", json=body) as r:
            assert r.status == 401  # no key
        other = {"model": "other", "prompt": "hello"}
        async with session.post(f"{url}/tokenize", json=other, headers=auth) as r:
            assert r.status == 404 and "not enabled" in (await r.json())["error"]["message"]
        async with session.post(f"{url}/v1/score", json=body, headers=auth) as r:
            assert r.status == 404  # listed by no route
    requests = scrape(url)["kvgate_requests_total"]
    assert any(s.labels["route"] == "/tokenize" and s.labels["status"] == "200" for s in requests)
