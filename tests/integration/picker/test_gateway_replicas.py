"""Gateway replicas as separate processes sharing their picks through a real redis-server
(``epp.replicas``): a prefix placed through one replica is warm through the other; with Redis
gone every request is still served and ``/readyz`` says the view is local only."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import aiohttp
import grpc

from kvgate.api import epp_pb2, epp_pb2_grpc
from loadtest.harness.processes import KvgateProcess, epp_process, free_port
from loadtest.harness.redis_server import RedisServer

SYSTEM = "{}: the system prompt of one application, long enough to span many blocks. "


def _policy(backends: list[str], redis_url: str) -> str:
    endpoints = ", ".join(b.removeprefix("http://") for b in backends)
    return f"""
pools: {{p: {{endpoints: [{endpoints}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
epp: {{replicas: {{store: '{redis_url}', key: 'test:replicas', timeout: 200ms}}}}
"""


async def _ask(
    session: aiohttp.ClientSession, url: str, question: str, app: int = 0
) -> tuple[int, float]:
    """Status and share of the prompt cached, of one chat request with ``app``'s system
    prompt."""
    system = SYSTEM.format(app) * 12
    body = {
        "model": "kvgate-sim",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 2,
    }
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        answer = await response.json()
    usage = answer.get("usage", {})
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return response.status, cached / usage.get("prompt_tokens", 1)


async def _view(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(f"{url}/readyz") as response:
        return response.status, (await response.json()).get("view", "")


async def test_a_prefix_placed_through_one_replica_is_warm_through_the_other(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    redis_server: RedisServer,
) -> None:
    backends = [start_backend("--cost", "zero") for _ in range(4)]
    policy = _policy(backends, redis_server.url)
    first, _ = start_gateway(policy)
    second, _ = start_gateway(policy)
    async with aiohttp.ClientSession() as session:
        assert await _view(session, first) == (200, "shared")
        for app in range(4):  # spread over the backends by the first replica
            assert (await _ask(session, first, "a first question?", app))[0] == 200
        await asyncio.sleep(0.3)  # the picks reach the other replica
        # asked in another order (alone, the second replica would place them as the first did)
        for app in reversed(range(4)):
            status, cached = await _ask(session, second, "a question from elsewhere?", app)
            assert status == 200 and cached > 0.8, (app, cached)


async def test_without_redis_every_request_is_served_on_a_local_view(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    redis_server: RedisServer,
) -> None:
    backends = [start_backend("--cost", "zero") for _ in range(2)]
    url, _ = start_gateway(_policy(backends, redis_server.url))
    async with aiohttp.ClientSession() as session:
        assert await _view(session, url) == (200, "shared")
        redis_server.stop()
        statuses = [(await _ask(session, url, f"question {n}?"))[0] for n in range(10)]
        assert statuses == [200] * 10
        for _ in range(50):
            if await _view(session, url) == (200, "local only"):
                break
            await asyncio.sleep(0.1)
        assert await _view(session, url) == (200, "local only")
        redis_server.start()
        for _ in range(50):
            if await _view(session, url) == (200, "shared"):
                break
            await asyncio.sleep(0.1)
        assert await _view(session, url) == (200, "shared")


async def test_epp_replicas_behind_envoy_are_all_active_and_agree(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Two ``kvgate epp`` processes sharing picks: what one placed through its Pick API, the
    other ranks first, and its /readyz says the view is shared."""
    policy = tmp_path / "epp.yaml"
    policy.write_text(
        "pools: {p: {endpoints: [127.0.1.1:9001, 127.0.1.1:9002, 127.0.1.1:9003]}}\n"
        "routes: [{model: m, pool: p}]\n"
        f"epp: {{replicas: {{store: '{redis_server.url}', key: 'test:epp'}}}}\n"
    )
    ports = [(free_port(), free_port()) for _ in range(2)]
    with epp_process(str(policy), *ports[0]), epp_process(str(policy), *ports[1]):
        (first, first_metrics), (second, second_metrics) = ports
        async with aiohttp.ClientSession() as session:
            for metrics in (first_metrics, second_metrics):
                assert await _view(session, f"http://127.0.0.1:{metrics}") == (200, "shared")
        placed = []
        for number in range(3):
            text = f"system prompt {number}: " + "of one application, long and shared. " * 20
            with grpc.insecure_channel(f"127.0.0.1:{first}") as channel:
                stub = epp_pb2_grpc.EndpointPickerStub(channel)  # type: ignore[no-untyped-call]
                reply = stub.Pick(epp_pb2.PickRequest(model="m", routing_text=text), timeout=5)
            placed.append((text, reply.endpoints[0].address))
        assert len({address for _, address in placed}) == 3  # spread over the endpoints
        await asyncio.sleep(0.3)
        with grpc.insecure_channel(f"127.0.0.1:{second}") as channel:
            stub = epp_pb2_grpc.EndpointPickerStub(channel)  # type: ignore[no-untyped-call]
            for text, address in reversed(placed):
                reply = stub.Pick(epp_pb2.PickRequest(model="m", routing_text=text), timeout=5)
                assert reply.endpoints[0].address == address
