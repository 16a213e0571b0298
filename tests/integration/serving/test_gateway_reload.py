"""Hot reload under steady load, rejected reloads, and the admin API."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from loadtest.harness.processes import KvgateProcess, free_port
from tests.integration.metrics_util import scrape

TOKEN = "admin-token-0123456789"


def policy(a: str, b: str, weight_b: int, admin_port: int) -> str:
    return f"""
listen: {{admin: {{host: 127.0.0.1, port: {admin_port}, token: "{TOKEN}"}}}}
pools: {{a: {{model: kvgate-sim, endpoints: [{a}]}}, b: {{model: kvgate-sim, endpoints: [{b}]}}}}
routes:
  - {{model: kvgate-sim, canary: [{{pool: a, weight: {100 - weight_b}}}, {{pool: b, weight: {weight_b}}}]}}
observability: {{access_log: "off"}}
"""


def served(backend: str) -> float:
    return sum(s.value for s in scrape(f"http://{backend}").get("vllm:request_success_total", []))


async def test_reload_under_load_changes_canary_weights_without_failures(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    tmp_path: object,
) -> None:
    a = start_backend("--cost", "0.002,0,0,0").removeprefix("http://")
    b = start_backend("--cost", "0.002,0,0,0").removeprefix("http://")
    admin_port = free_port()
    url, gateway = start_gateway(policy(a, b, 0, admin_port))
    policy_file = gateway.args[gateway.args.index("--policy") + 1]
    statuses: list[int] = []
    stop = asyncio.Event()
    body = {"model": "kvgate-sim", "prompt": "load", "max_tokens": 2}

    async def load(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            async with session.post(f"{url}/v1/completions", json=body) as response:
                await response.read()
                statuses.append(response.status)

    async with aiohttp.ClientSession() as session:
        workers = [asyncio.create_task(load(session)) for _ in range(8)]
        await asyncio.sleep(1.0)
        assert served(b) == 0
        with open(policy_file, "w") as handle:  # noqa: ASYNC230 - a small local file
            handle.write(policy(a, b, 100, admin_port))
        for _ in range(50):  # the file is polled every second; allow up to 10 s
            if served(b):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*workers)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with session.get(f"http://127.0.0.1:{admin_port}/admin/policy", headers=headers) as r:
            info = await r.json()
    assert served(b) > 0 and info["version"] == 2
    assert statuses and set(statuses) == {200}, set(statuses)  # zero failed requests


async def test_invalid_policy_is_rejected_and_admin_is_guarded(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    a = start_backend("--cost", "zero").removeprefix("http://")
    admin_port = free_port()
    url, gateway = start_gateway(policy(a, a.replace("127.0.0.1", "localhost"), 0, admin_port))
    policy_file = gateway.args[gateway.args.index("--policy") + 1]
    admin = f"http://127.0.0.1:{admin_port}/admin"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{admin}/breakers") as response:
            assert response.status == 401
        async with session.get(
            f"{admin}/breakers", headers={"Authorization": "Bearer wrong"}
        ) as response:
            assert response.status == 401
        with open(policy_file, "w") as handle:  # noqa: ASYNC230 - a small local file
            handle.write("pools: {a: {endpoints: [not-an-address]}}\nroutes: []\n")
        async with session.post(f"{admin}/reload", headers=headers) as response:
            result = await response.json()
            assert response.status == 422 and not result["applied"]
            assert any("must be host:port" in e for e in result["errors"])
        async with session.post(
            f"{url}/v1/completions", json={"model": "kvgate-sim", "prompt": "x", "max_tokens": 1}
        ) as response:
            assert response.status == 200  # the old policy still serves
        for path in ("breakers", "queues", "limits", "policy"):
            async with session.get(f"{admin}/{path}", headers=headers) as response:
                assert response.status == 200, path
                data = await response.json()
                if path == "breakers":
                    assert {e["state"] for pool in data.values() for e in pool} == {"closed"}
                if path == "policy":
                    assert data["version"] == 1
    reloads = {s.labels["result"]: s.value for s in scrape(url)["kvgate_policy_reloads_total"]}
    assert reloads.get("rejected", 0) >= 1
