"""Builders for EPP tests (GIE's MakePod idea)."""

from __future__ import annotations

import time

from epp.framework import Endpoint, EndpointMetadata, EndpointMetrics, SchedulingRequest


def make_endpoint(
    address: str = "10.0.0.1:8000",
    *,
    queue: int = 0,
    running: int = 0,
    kv: float = 0.0,
    running_loras: tuple[str, ...] = (),
    waiting_loras: tuple[str, ...] = (),
    max_loras: int = 0,
    role: str = "both",
    fresh: bool = True,
    pool: str = "p",
    capacity: float = 1.0,
) -> Endpoint:
    metrics = EndpointMetrics(
        waiting=queue,
        running=running,
        kv_usage=kv,
        block_size=16,
        num_gpu_blocks=1000,
        running_loras=frozenset(running_loras),
        waiting_loras=frozenset(waiting_loras),
        max_loras=max_loras,
        scraped_at=time.monotonic() if fresh else 0.0,
    )
    return Endpoint(EndpointMetadata(address, pool, role), metrics, capacity=capacity)


def make_request(
    text: str = "",
    *,
    lora: str | None = None,
    session: str | None = None,
    request_id: str = "",
    model: str = "m",
) -> SchedulingRequest:
    headers = {"x-session-id": session} if session else {}
    return SchedulingRequest(request_id, model, text, lora, headers)
