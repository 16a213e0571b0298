"""One saturation setting (``epp.saturation``), obeyed by the saturation filter, the gateway's
admission gate and ext_proc's shedding of sheddable requests."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import orjson

from bench.envoy_messages import body_messages, headers_message
from epp.metrics import EppMetrics
from epp.scheduling.filters.saturation import SaturationFilter
from epp.servers.ext_proc import ExternalProcessor
from gateway.base.metrics import GatewayMetrics
from gateway.reload import admission_gate
from gateway.request.runtime import Runtime, RuntimeParts, build_runtime
from kvgate.api.envoy import external_processor_pb2 as ep
from kvgate.wire.http.connection_pool import ConnectionPool
from policies.loader import load_policy_text
from tests.epp.builders import make_request

POLICY = """
pools: {p: {endpoints: [127.0.0.2:1, 127.0.0.2:2]}}
routes: [{model: m, pool: p}]
epp:
  saturation: {queue_depth: 2, kv_usage: 0.5, max_metrics_age: 10s}
  objectives: {sheddable: {priority: -1}, batch-sheddable: {priority: 0}, chat: {priority: 5}}
  plugins:
    - {name: sat, type: saturation-filter}
    - {name: prefix, type: prefix-cache-scorer}
    - {name: pick, type: max-score-picker}
  profiles: [{name: default, plugins: [{ref: sat}, {ref: prefix, weight: 3}, {ref: pick}]}]
"""


def runtime_with_load(waiting: tuple[int, int], kv: tuple[float, float]) -> Runtime:
    """The gateway's runtime for POLICY, its two endpoints freshly scraped with this load."""
    parts = RuntimeParts(GatewayMetrics(), EppMetrics(), ConnectionPool(connect_timeout=1.0))
    runtime = build_runtime(load_policy_text(POLICY), parts)
    embedded = runtime.embedded
    assert embedded is not None
    for endpoint, queue, usage in zip(
        embedded.service.datastore.endpoints("p"), waiting, kv, strict=True
    ):
        endpoint.metrics.waiting, endpoint.metrics.kv_usage = queue, usage
        endpoint.metrics.scraped_at = time.monotonic()
    return runtime


def gate_open(runtime: Runtime) -> bool:
    return admission_gate(runtime).has_room("p")


async def ext_proc_status(runtime: Runtime, objective: str = "sheddable") -> int:
    """The status ext_proc answers a request of ``objective`` with (200: routed)."""
    body = orjson.dumps({"model": "m", "prompt": "hello"})
    headers = {":path": "/v1/completions", "x-gateway-inference-objective": objective}
    messages = [headers_message(headers), *body_messages(body)]

    async def requests() -> AsyncIterator[ep.ProcessingRequest]:
        for message in messages:
            yield message

    assert runtime.embedded is not None
    async for reply in ExternalProcessor(runtime.embedded.service).Process(requests(), None):
        if reply.HasField("immediate_response"):
            return int(reply.immediate_response.status.code)
    return 200


def profile_filter(runtime: Runtime) -> SaturationFilter:
    assert runtime.embedded is not None
    filters = runtime.embedded.service.scheduler.profile.filters
    return next(f for f in filters if isinstance(f, SaturationFilter))


async def test_all_three_use_the_policys_thresholds() -> None:
    # 2 waiting is saturated here (the built-in default is 5)
    queued = runtime_with_load((2, 2), (0.0, 0.0))
    assert not gate_open(queued)
    assert await ext_proc_status(queued) == 429
    # 60% KV is saturated here (the built-in default is 80%)
    full = runtime_with_load((0, 0), (0.6, 0.6))
    assert not gate_open(full)
    assert await ext_proc_status(full) == 429
    # one endpoint under both thresholds: the filter keeps just it, the gate and ext_proc admit
    mixed = runtime_with_load((2, 1), (0.0, 0.4))
    assert mixed.embedded is not None
    endpoints = mixed.embedded.service.datastore.endpoints("p")
    assert profile_filter(mixed).filter(make_request(), endpoints) == [endpoints[1]]
    assert gate_open(mixed)
    assert await ext_proc_status(mixed) == 200


async def test_ext_proc_sheds_by_the_objectives_priority_as_gie_does() -> None:
    saturated = runtime_with_load((2, 2), (0.0, 0.0))
    assert await ext_proc_status(saturated, "sheddable") == 429  # priority -1
    # neither a name nor an unknown objective makes a request sheddable: only its priority
    assert await ext_proc_status(saturated, "batch-sheddable") == 200
    assert await ext_proc_status(saturated, "chat") == 200
    assert await ext_proc_status(saturated, "not-listed") == 200
    idle = runtime_with_load((0, 0), (0.0, 0.0))
    assert await ext_proc_status(idle, "sheddable") == 200  # shed only when saturated


def test_picks_and_a_gate_holding_requests_back_count_as_reads_of_the_metrics() -> None:
    # the scraper keeps a busy endpoint's metrics fresh only while something reads them
    runtime = runtime_with_load((0, 0), (0.0, 0.0))
    assert runtime.embedded is not None
    scraper = runtime.embedded.service.scraper
    assert gate_open(runtime) and scraper.reads == 0  # open: the pick that follows reads them
    runtime.embedded.service.pick("p", make_request("hello"))
    assert scraper.reads == 1
    held = runtime_with_load((2, 2), (0.0, 0.0))
    assert held.embedded is not None
    assert not gate_open(held) and held.embedded.service.scraper.reads == 1
