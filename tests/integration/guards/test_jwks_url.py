"""``jwks_url``: the issuer's keys are fetched before the gateway serves and
fetched again when a token names a key id the set lacks (a rotation), at most once per
``MIN_REFRESH_GAP`` however many such tokens arrive; the fetch never blocks requests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from loadtest.harness.processes import KvgateProcess
from tests.gateway.jwt_keys import make_keys
from tests.http_servers import serving
from tests.integration.guards.test_jwks_reload import status_with


async def test_keys_are_fetched_refreshed_on_a_rotation_and_rate_limited(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    tmp_path: Path,
) -> None:
    keys = make_keys(tmp_path)
    published = json.loads(keys.jwks_path.read_text())
    rsa_only = {"keys": [k for k in published["keys"] if k["kid"] == "rsa-1"]}
    document = {"jwks": rsa_only}
    fetches: list[str] = []

    async def jwks(request: web.Request) -> web.Response:
        fetches.append(request.path)
        return web.json_response(document["jwks"])

    app = web.Application()
    app.router.add_get("/.well-known/jwks.json", jwks)
    backend = start_backend("--cost", "zero").removeprefix("http://")
    async with serving(app) as port:
        policy = f"""
pools: {{p: {{endpoints: [{backend}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
tenants: {{acme: {{}}}}
auth:
  jwt:
    - {{issuer: "https://idp.test", audience: kvgate,
        jwks_url: "http://127.0.0.1:{port}/.well-known/jwks.json",
        algorithms: [RS256, ES256], claims: {{tenant: org}}}}
"""
        # started from a thread: this loop serves the JWKS while the gateway starts
        url, _ = await asyncio.to_thread(start_gateway, policy)
        assert len(fetches) == 1  # fetched before the gateway answered its health check
        assert await status_with(url, keys.token("RS256")) == 200
        document["jwks"] = published  # the issuer adds its EC key
        ec_token = keys.token("ES256")
        assert await status_with(url, ec_token) == 401  # unknown yet: a fetch is started
        for _ in range(50):
            if await status_with(url, ec_token) == 200:
                break
            await asyncio.sleep(0.05)
        assert await status_with(url, ec_token) == 200
        assert len(fetches) == 2
        unknown = [keys.token("RS256", kid=f"nope-{i}") for i in range(20)]
        assert [await status_with(url, t) for t in unknown] == [401] * 20
        await asyncio.sleep(0.2)
        assert len(fetches) == 2  # misses within the gap fetch nothing more
