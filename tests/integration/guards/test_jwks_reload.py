"""JWKS files are watched with the policy: a key removed from the file stops
validating within the watch interval, with no change to the policy file."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import aiohttp

from loadtest.harness.processes import KvgateProcess
from tests.gateway.jwt_keys import make_keys


async def status_with(url: str, token: str) -> int:
    body = {"model": "kvgate-sim", "prompt": "x", "max_tokens": 1}
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/completions", json=body, headers=headers) as response,
    ):
        await response.read()
        return response.status


async def test_a_key_removed_from_the_jwks_file_stops_validating(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    tmp_path: Path,
) -> None:
    keys = make_keys(tmp_path)
    backend = start_backend("--cost", "zero").removeprefix("http://")
    url, _ = start_gateway(f"""
pools: {{p: {{endpoints: [{backend}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
tenants: {{acme: {{}}}}
auth:
  jwt:
    - {{issuer: "https://idp.test", audience: kvgate, jwks_file: {keys.jwks_path},
        algorithms: [RS256, ES256], claims: {{tenant: org}}}}
""")
    rsa_token, ec_token = keys.token("RS256"), keys.token("ES256")
    assert await status_with(url, rsa_token) == 200
    jwks = json.loads(keys.jwks_path.read_text())
    jwks["keys"] = [k for k in jwks["keys"] if k["kid"] != "rsa-1"]  # rotate the RSA key out
    await asyncio.to_thread(keys.jwks_path.write_text, json.dumps(jwks))
    for _ in range(40):
        if await status_with(url, rsa_token) == 401:
            break
        await asyncio.sleep(0.1)
    assert await status_with(url, rsa_token) == 401
    assert await status_with(url, ec_token) == 200  # the key still listed still validates
