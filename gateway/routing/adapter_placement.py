"""LoRA adapters the gateway places itself: a pool whose ``adapters`` name a source path for
each adapter has every request for one sent to an endpoint that has it loaded.

Before a try is sent to the endpoint the picker chose, the adapter is loaded there through
vLLM's dynamic adapter API (``POST /v1/load_lora_adapter``; vLLM serves it with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, the reference backend always) unless this gateway
process loaded it there already. Requests for the same adapter on the same endpoint wait on
one load, not one each. An endpoint holds at most ``max_adapters``: to make room, the coldest
adapter (least recently used) that no request in flight is using is unloaded
(``/v1/unload_lora_adapter``); while every one is in use, the load waits for one to be free.
The picker's LoRA affinity keeps sending an adapter's requests where it was sent before, so an
adapter is loaded on as few endpoints as the load allows.

An engine that already has the adapter (it was loaded before this process started) answers
the load with a 400 that says so: it counts as loaded. An engine that lost it (restarted)
answers the request 404; the gateway then forgets it there, so the next request loads it
again.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping

import orjson

from gateway.base.errors import NoEndpoint, UpstreamError
from gateway.base.metrics import GatewayMetrics
from kvgate.wire.http.connection_pool import ConnectionPool
from kvgate.wire.http.messages import header_block
from policies.schema import Pool

LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
ANSWER_LIMIT = 64 << 10  # bytes read of a load's or unload's answer
Release = Callable[[], None]


class AdapterPlacement:
    """Which of one pool's adapters this process loaded on each endpoint, coldest first."""

    def __init__(
        self,
        pool: Pool,
        upstreams: ConnectionPool,
        metrics: GatewayMetrics,
        timeout: float = 60.0,
    ) -> None:
        self.pool = pool.name
        self.paths: Mapping[str, str] = pool.adapter_paths
        self.max_adapters = pool.max_adapters
        self.timeout = timeout  # a load's, an unload's, and a wait for a free slot
        self._upstreams = upstreams
        self._metrics = metrics
        auth = {"authorization": f"Bearer {pool.api_key}"} if pool.api_key else {}
        self._headers = b"content-type: application/json\r\n" + header_block(auth.items())
        self.loaded: dict[str, OrderedDict[str, None]] = {}  # by address, coldest first
        self._in_use: Counter[tuple[str, str]] = Counter()  # (address, adapter): tries
        self._loading: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._placed: dict[str, set[str]] = {}  # by address: loaded or loading (the picker's)
        self._freed = asyncio.Event()  # set when a try stops using an adapter
        self._tasks: set[asyncio.Task[None]] = set()

    def loaded_on(self, address: str) -> OrderedDict[str, None]:
        """The adapters loaded on ``address``, coldest first."""
        return self.loaded.setdefault(address, OrderedDict())

    def placed_on(self, address: str) -> set[str]:
        """The adapters loaded on ``address`` or being loaded there: a live record the picker
        reads, so that a burst for a new adapter follows its first request there."""
        return self._placed.setdefault(address, set())

    def adapter_of(self, model: str) -> str | None:
        """The adapter a request for ``model`` (the name the pool's engines serve) needs placed."""
        return model if model in self.paths else None

    async def acquire(self, address: str, adapter: str) -> Release:
        """Have ``adapter`` loaded on ``address`` and count one try using it; the returned
        function ends that use. ``UpstreamError`` when the engine refuses the load,
        ``NoEndpoint`` when no slot frees in time, and the connection's own errors."""
        key = (address, adapter)
        self._in_use[key] += 1  # from now: a loaded adapter is not unloaded under a waiter
        try:
            while adapter not in self.loaded_on(address):
                pending = self._loading.get(key)
                if pending is None:  # placed at once: the picker sends a burst here too
                    pending = self._start_load(address, adapter)
                await asyncio.shield(pending)
        except BaseException:
            self._release(key)
            raise
        self.loaded_on(address).move_to_end(adapter)
        return lambda: self._release(key)

    def _start_load(self, address: str, adapter: str) -> asyncio.Future[None]:
        pending = self._loading[(address, adapter)] = asyncio.get_running_loop().create_future()
        pending.add_done_callback(_retrieve)
        self.placed_on(address).add(adapter)
        task = asyncio.get_running_loop().create_task(self._load(address, adapter, pending))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return pending

    def forget(self, address: str, adapter: str) -> None:
        """The engine at ``address`` no longer has ``adapter`` (it answered a request for it
        with a 404): load it again for the next one."""
        loaded = self.loaded.get(address)
        if loaded is not None and adapter in loaded:
            del loaded[adapter]
            self.placed_on(address).discard(adapter)
            self._count("lost")

    def _release(self, key: tuple[str, str]) -> None:
        self._in_use[key] -= 1
        if self._in_use[key] <= 0:
            del self._in_use[key]
            self._freed.set()

    async def _load(self, address: str, adapter: str, done: asyncio.Future[None]) -> None:
        key = (address, adapter)
        try:
            await self._make_room(address)
            source = {"lora_name": adapter, "lora_path": self.paths[adapter]}
            await self._post(address, LOAD, source)
            self.loaded_on(address)[adapter] = None
            self._count("loaded")
            done.set_result(None)
        except BaseException as exc:
            self.placed_on(address).discard(adapter)
            self._count("failed")
            done.set_exception(exc)
        finally:
            del self._loading[key]

    async def _make_room(self, address: str) -> None:
        """Unload the coldest idle adapters until a load fits under ``max_adapters``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while True:
            loaded = self.loaded_on(address)
            loading = sum(1 for there, _ in self._loading if there == address)  # this one too
            if len(loaded) + loading <= self.max_adapters:
                return
            idle = next((a for a in loaded if not self._in_use[(address, a)]), None)
            if idle is not None:
                del loaded[idle]
                self.placed_on(address).discard(idle)
                await self._post(address, UNLOAD, {"lora_name": idle})
                self._count("unloaded")
                continue
            self._freed.clear()  # every adapter there is in use: wait for one to be free
            try:
                await asyncio.wait_for(self._freed.wait(), deadline - loop.time())
            except TimeoutError:
                raise NoEndpoint(
                    f"all {self.max_adapters} LoRA adapter slots of {address} stayed in use "
                    f"for {self.timeout:g}s"
                ) from None

    async def _post(self, address: str, path: str, body: dict[str, str]) -> None:
        response = await self._upstreams.request(
            address, "POST", path, self._headers, orjson.dumps(body), first_byte=self.timeout
        )
        try:
            answer = await response.read(self.timeout, ANSWER_LIMIT)
        finally:
            response.close()
        if response.status == 200 or _already_done(path, response.status, answer):
            return
        text = answer.decode("utf-8", "replace")[:300]
        raise UpstreamError(f"{address} answered {path} with HTTP {response.status}: {text}")

    def _count(self, outcome: str) -> None:
        self._metrics.child(self._metrics.adapter_changes, self.pool, outcome).inc()


def _already_done(path: str, status: int, answer: bytes) -> bool:
    """An engine that has the adapter already (a load's 400 says so), or has not got it (an
    unload's 404): what was asked is the case."""
    if path == LOAD:
        return status == 400 and b"already been loaded" in answer
    return status == 404


def _retrieve(future: asyncio.Future[None]) -> None:
    """Take a failed load's exception off its future, whether or not a request waits on it."""
    if not future.cancelled():
        future.exception()
