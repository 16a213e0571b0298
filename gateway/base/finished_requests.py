"""Finished requests added up for the request metrics, in plain dicts and lists.

Each finished request adds its counts here at once (a context kept until the next flush would
outlive young garbage collections and make every one of them slower), into the totals of its
route, model, status and class; ``drain_into`` gathers them per metric label and hands them to
the batched metrics when they are flushed, where the latencies are bucketed per label in one
pass (``BatchedHistogram.observe_many``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.base.metric_batch import BatchedCounter, BatchedHistogram

if TYPE_CHECKING:
    from gateway.base.context import RequestContext


class RequestTotals:
    """What the finished requests of one route, model, status and priority class added up to
    since the last flush."""

    __slots__ = ("completion", "count", "latencies", "prompt", "tpots", "ttfts", "waits")

    def __init__(self) -> None:
        self.count = 0
        self.prompt = 0
        self.completion = 0
        self.latencies: list[float] = []
        self.ttfts: list[float] = []
        self.tpots: list[float] = []  # streams of two tokens or more: seconds per later token
        self.waits: list[float] = []


TotalsKey = tuple[str, str, int, str]  # route (path), model, status, priority class
STREAM_BROKEN = "upstream_stream_broken"  # the error of a stream that ended with an error event


def outcome_status(ctx: RequestContext) -> int:
    """The status a finished request counts as: the one it was answered with, but 502 for a
    stream that broke after its 200 head (the client got an error event, not an answer)."""
    return 502 if ctx.error == STREAM_BROKEN else ctx.status


class FinishedRequests:
    """Requests by route, model and status; latency per route; time to first byte and tokens
    per model; queue wait per class. A request costs one lookup (of its route, model, status
    and class together) and a few appends; the labels of each metric are gathered at flush."""

    __slots__ = ("_totals",)

    def __init__(self) -> None:
        self._totals: dict[TotalsKey, RequestTotals] = {}

    def add(self, ctx: RequestContext) -> None:
        key = (ctx.route, ctx.model, outcome_status(ctx), ctx.priority_class)
        totals = self._totals.get(key)
        if totals is None:
            totals = self._totals[key] = RequestTotals()
        totals.count += 1
        totals.latencies.append(ctx.elapsed)
        if ctx.ttft is not None:
            totals.ttfts.append(ctx.ttft)
            tpot = ctx.tpot
            if tpot is not None:
                totals.tpots.append(tpot)
        totals.prompt += ctx.prompt_tokens
        totals.completion += ctx.completion_tokens
        if ctx.queue_wait is not None:
            totals.waits.append(ctx.queue_wait)

    def drain_into(
        self,
        requests: BatchedCounter,
        latency: BatchedHistogram,
        ttft: BatchedHistogram,
        tpot: BatchedHistogram,
        tokens: BatchedCounter,
        queue_wait: BatchedHistogram,
    ) -> dict[TotalsKey, RequestTotals]:
        """Move everything added so far into the batches, and start again; the totals moved
        are returned (the SLO tracker reads them too)."""
        totals, self._totals = self._totals, {}
        latencies: dict[str, list[float]] = {}
        ttfts: dict[str, list[float]] = {}
        tpots: dict[str, list[float]] = {}
        waits: dict[str, list[float]] = {}
        for (route, model, status, priority_class), added in totals.items():
            requests.add((route, model, str(status)), added.count)
            latencies.setdefault(route, []).extend(added.latencies)
            if added.ttfts:
                ttfts.setdefault(model, []).extend(added.ttfts)
            if added.tpots:
                tpots.setdefault(model, []).extend(added.tpots)
            if added.waits:
                waits.setdefault(priority_class, []).extend(added.waits)
            if added.prompt or added.completion:
                tokens.add((model, "prompt"), added.prompt)
                tokens.add((model, "completion"), added.completion)
        for histogram, values in (
            (latency, latencies),
            (ttft, ttfts),
            (tpot, tpots),
            (queue_wait, waits),
        ):
            for label, observed in values.items():
                histogram.observe_many((label,), observed)
        return totals
