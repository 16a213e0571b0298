"""Sends a workload to an OpenAI-compatible server and records every request.

Open loop (stages with a ``rate``): chains start at seeded Poisson times whatever the server
does, ``rate`` requests a second on average (a chain of ``n`` requests starts at ``rate / n``),
or at a trace's own times where every chain's first request carries one (``ChatRequest.at``);
a chain's next request goes when the previous one has finished. Closed loop (stages with a
``concurrency``): that many workers each send their next chain as soon as the last is done.
Both stop at ``max_requests`` sent or ``max_seconds`` after the start (requests in flight then
are waited for), or when the workload runs out.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import xxhash

from loadtest.client.sse import StreamResult, stream_request
from loadtest.reports.records import RequestRecord
from loadtest.reports.stage_report import Stage
from loadtest.workloads.arrivals import poisson_starts, stage_of
from loadtest.workloads.chats import Chain, ChatRequest

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass
class LoadPlan:
    url: str  # the server's base URL
    model: str
    chains: list[Chain]
    stages: list[Stage]
    output_tokens: int = 64
    endpoint: str = "chat"
    max_requests: int | None = None
    max_seconds: float | None = None
    request_timeout: float = 600.0
    headers: dict[str, str] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a load needs at least one stage")
        closed = {bool(s.concurrency) for s in self.stages}
        if len(closed) > 1:
            raise ValueError("stages are either all rates (open loop) or all concurrencies")
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint {self.endpoint!r}: one of {', '.join(ENDPOINTS)}")

    @property
    def planned_requests(self) -> int:
        total = sum(len(c) for c in self.chains)
        return min(total, self.max_requests) if self.max_requests is not None else total

    def stage_spans(self) -> list[tuple[float, float]]:
        """(rate or concurrency, seconds) per stage, as the schedule functions take them."""
        return [(s.rate or float(s.concurrency), s.duration) for s in self.stages]


@dataclass
class LoadRun:
    records: list[RequestRecord]
    duration: float
    stage_seconds: list[float]


def body_for(plan: LoadPlan, request: ChatRequest) -> dict[str, object]:
    body = request.body(plan.model, plan.output_tokens)
    if plan.endpoint == "completions":
        messages = body.pop("messages")
        assert isinstance(messages, list)
        body["prompt"] = "\n".join(m["content"] for m in messages)
    return body


def record_of(
    result: StreamResult, start: float, stage: int, group: str, index: int = -1, call: int = 0
) -> RequestRecord:
    kind = ""
    if result.status >= 500:
        kind = "http_5xx"
    elif result.status >= 400:
        kind = "http_4xx"
    elif result.error:
        kind = "stream_error"
    elif not result.done:
        kind = "incomplete"
    times = result.chunk_times
    return RequestRecord(
        start=start,
        stage=stage,
        error_kind=kind,
        error=result.error[:500],
        ttft=result.ttft,
        latency=result.latency,
        itls=[b - a for a, b in itertools.pairwise(times)],
        prompt_tokens=result.prompt_tokens,
        output_tokens=result.output_tokens,
        cached_tokens=result.cached_tokens,
        group=group,
        index=index,
        call=call,
        digest=xxhash.xxh64_hexdigest(result.text.encode()),
    )


class _Sender:
    """Sends requests for one run and keeps their records."""

    def __init__(self, plan: LoadPlan, session: aiohttp.ClientSession, on_done: Callable[[], None]):
        self.plan = plan
        self.session = session
        self.on_done = on_done
        self.began = time.perf_counter()
        self.sent = 0
        self.records: list[RequestRecord] = []
        flat = (r for chain in plan.chains for r in chain)
        self.index_of = {id(r): i for i, r in enumerate(flat)}
        self.spans = spans = plan.stage_spans()
        self.url = plan.url.rstrip("/") + ENDPOINTS[plan.endpoint]
        timed = sum(seconds for _, seconds in spans) if spans[-1][1] else math.inf
        self.deadline = min(timed, plan.max_seconds if plan.max_seconds is not None else math.inf)

    def now(self) -> float:
        return time.perf_counter() - self.began

    def may_send(self) -> bool:
        plan = self.plan
        if plan.max_requests is not None and self.sent >= plan.max_requests:
            return False
        return self.now() < self.deadline

    async def chain(self, chain: Chain) -> None:
        for call, request in enumerate(chain):
            if request.pause:
                await asyncio.sleep(request.pause)  # the agent's tool runs
            if not self.may_send():
                return
            self.sent += 1
            start = self.now()
            stage = stage_of(start, self.spans)
            index = self.index_of.get(id(request), -1)
            try:
                result = await asyncio.wait_for(
                    stream_request(
                        self.session, self.url, body_for(self.plan, request), request.headers
                    ),
                    self.plan.request_timeout,
                )
                record = record_of(result, start, stage, request.group, index, call)
            except TimeoutError:
                record = RequestRecord(
                    start, stage, "timeout", "no answer in time", group=request.group,
                    index=index, call=call,
                )  # fmt: skip
            except (aiohttp.ClientError, OSError) as exc:
                error = f"{type(exc).__name__}: {exc}"
                record = RequestRecord(
                    start, stage, "connection", error, group=request.group, index=index, call=call
                )
            self.records.append(record)
            self.on_done()
            if not record.ok and record.error_kind in ("connection", "timeout"):
                return  # the rest of this conversation would resend a history that failed


async def run_load(plan: LoadPlan, on_done: Callable[[], None] = lambda: None) -> LoadRun:
    connector = aiohttp.TCPConnector(limit=0)
    headers = {"User-Agent": "kvgate-loadtest", **plan.headers}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        sender = _Sender(plan, session, on_done)
        if plan.stages[0].concurrency:
            await _closed_loop(plan, sender)
        else:
            await _open_loop(plan, sender)
        duration = sender.now()
    return LoadRun(
        sorted(sender.records, key=lambda r: r.start), duration, _stage_seconds(plan, duration)
    )


async def _open_loop(plan: LoadPlan, sender: _Sender) -> None:
    mean_chain = statistics.fmean(len(c) for c in plan.chains) if plan.chains else 1.0
    spans = [(rate / mean_chain, seconds) for rate, seconds in plan.stage_spans()]
    timed = [c[0].at for c in plan.chains if c and c[0].at is not None]
    if len(timed) == len(plan.chains):  # a trace: its own send times
        starts: list[float] = [at for at in timed if at is not None]
    else:
        starts = poisson_starts(len(plan.chains), spans, plan.seed)

    async def later(chain: Chain, at: float) -> None:
        await asyncio.sleep(max(0.0, at - sender.now()))
        await sender.chain(chain)

    await asyncio.gather(*(later(c, t) for c, t in zip(plan.chains, starts, strict=False)))


async def _closed_loop(plan: LoadPlan, sender: _Sender) -> None:
    pending = iter(plan.chains)
    spans = plan.stage_spans()
    ends = list(itertools.accumulate(s for _, s in spans))

    async def worker(index: int) -> None:
        while sender.may_send():
            stage = stage_of(sender.now(), spans)
            if index >= plan.stages[stage].concurrency:
                if not spans[stage][1] or stage == len(spans) - 1:
                    return  # not needed in the last stage
                await asyncio.sleep(max(0.001, ends[stage] - sender.now()))
                continue
            chain = next(pending, None)
            if chain is None:
                return
            await sender.chain(chain)

    most = max(s.concurrency for s in plan.stages)
    await asyncio.gather(*(worker(i) for i in range(most)))


def _stage_seconds(plan: LoadPlan, duration: float) -> list[float]:
    seconds: list[float] = []
    start = 0.0
    for stage in plan.stages:
        end = start + stage.duration if stage.duration else math.inf
        seconds.append(max(0.0, min(end, duration) - start))
        start = end
        if start >= duration:
            start = duration
    return seconds
