"""The gateway's LoRA adapter placement against a real loopback server that speaks vLLM's
dynamic adapter API: one load per adapter and endpoint however many requests wait on it, the
coldest idle adapter unloaded to make room, none unloaded while in use, refusals as errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from gateway.base.errors import NoEndpoint, UpstreamError
from gateway.base.metrics import GatewayMetrics
from gateway.routing.adapter_placement import AdapterPlacement
from kvgate.wire.http.connection_pool import ConnectionPool
from policies.schema import EndpointSpec, Pool
from tests.fakes import close_after_test
from tests.http_servers import serving


@dataclass
class Engine:
    """What the loopback engine was asked, and a gate every load waits on."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    loaded: set[str] = field(default_factory=set)
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        async def load(request: web.Request) -> web.Response:
            body = await request.json()
            self.calls.append(("load", body["lora_name"]))
            await self.gate.wait()
            if body["lora_path"] == "/broken":
                return web.json_response({"message": "Failed to load LoRA adapter"}, status=400)
            if body["lora_name"] in self.loaded:
                message = f"The lora adapter '{body['lora_name']}' has already been loaded."
                return web.json_response({"message": message}, status=400)
            self.loaded.add(body["lora_name"])
            return web.Response(text="Success")

        async def unload(request: web.Request) -> web.Response:
            name = (await request.json())["lora_name"]
            self.calls.append(("unload", name))
            self.loaded.discard(name)
            return web.Response(text="Success")

        app = web.Application()
        app.router.add_post("/v1/load_lora_adapter", load)
        app.router.add_post("/v1/unload_lora_adapter", unload)
        return app


@pytest.fixture
async def engine() -> AsyncIterator[tuple[Engine, str]]:
    fake = Engine()
    fake.gate.set()
    async with serving(fake.app()) as port:
        yield fake, f"127.0.0.1:{port}"


def placement(address: str, max_adapters: int, timeout: float = 5.0) -> AdapterPlacement:
    paths = {name: f"/adapters/{name}" for name in ("a", "b", "c")} | {"bad": "/broken"}
    pool = Pool("p", (EndpointSpec(address),), adapter_paths=paths, max_adapters=max_adapters)
    upstreams = close_after_test(ConnectionPool(connect_timeout=1.0))
    return AdapterPlacement(pool, upstreams, GatewayMetrics(), timeout=timeout)


async def test_requests_for_one_adapter_wait_on_one_load(engine: tuple[Engine, str]) -> None:
    fake, address = engine
    fake.gate.clear()
    places = placement(address, 2)
    waiting = [asyncio.create_task(places.acquire(address, "a")) for _ in range(10)]
    await asyncio.sleep(0.1)
    assert fake.calls == [("load", "a")]
    fake.gate.set()
    releases = await asyncio.gather(*waiting)
    assert fake.calls == [("load", "a")]  # ten requests, one load
    for release in releases:
        release()
    await places.acquire(address, "a")
    assert fake.calls == [("load", "a")]  # loaded: nothing to do


async def test_the_coldest_idle_adapter_makes_room(engine: tuple[Engine, str]) -> None:
    fake, address = engine
    places = placement(address, 2)
    (await places.acquire(address, "a"))()
    (await places.acquire(address, "b"))()
    (await places.acquire(address, "a"))()  # b is now the coldest
    (await places.acquire(address, "c"))()
    assert fake.calls[-2:] == [("unload", "b"), ("load", "c")]
    assert list(places.loaded[address]) == ["a", "c"]


async def test_an_adapter_in_use_is_not_unloaded(engine: tuple[Engine, str]) -> None:
    fake, address = engine
    places = placement(address, 1)
    release_a = await places.acquire(address, "a")
    wanting_b = asyncio.create_task(places.acquire(address, "b"))
    await asyncio.sleep(0.2)
    assert not wanting_b.done() and ("unload", "a") not in fake.calls
    release_a()  # a's request is over: b takes its slot
    (await asyncio.wait_for(wanting_b, 2))()
    assert fake.calls == [("load", "a"), ("unload", "a"), ("load", "b")]


async def test_no_slot_in_time_and_a_refused_load_are_errors(engine: tuple[Engine, str]) -> None:
    fake, address = engine
    places = placement(address, 1, timeout=0.2)
    await places.acquire(address, "a")  # held for good
    with pytest.raises(NoEndpoint, match="slots"):
        await places.acquire(address, "b")
    roomy = placement(address, 2)
    with pytest.raises(UpstreamError, match="HTTP 400"):
        await roomy.acquire(address, "bad")
    assert "bad" not in roomy.loaded[address] and "bad" not in roomy.placed_on(address)
    assert ("load", "bad") in fake.calls and "bad" not in fake.loaded


async def test_an_engine_that_has_it_already_counts_as_loaded(engine: tuple[Engine, str]) -> None:
    fake, address = engine
    fake.loaded.add("a")  # loaded before this gateway process started
    places = placement(address, 2)
    (await places.acquire(address, "a"))()
    assert list(places.loaded[address]) == ["a"]
    places.forget(address, "a")  # the engine answered a request for it 404
    assert list(places.loaded[address]) == []
