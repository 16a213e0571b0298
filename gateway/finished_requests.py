"""Finished requests added up for the request metrics, in plain dicts and lists.

Each finished request adds its counts here at once (a context kept until the next flush would
outlive young garbage collections and make every one of them slower); ``drain_into`` hands the
sums to the batched metrics when they are flushed, and the latencies are bucketed there per
label in one pass (``BatchedHistogram.observe_many``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.metric_batch import BatchedCounter, BatchedHistogram

if TYPE_CHECKING:
    from gateway.context import RequestContext


class FinishedRequests:
    """Requests by route, model and status; latency per route; time to first byte and tokens
    per model; queue wait per class."""

    __slots__ = ("_counts", "_latencies", "_tokens", "_ttfts", "_waits")

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._counts: dict[tuple[str, str, int], int] = {}
        self._latencies: dict[str, list[float]] = {}
        self._ttfts: dict[str, list[float]] = {}
        self._tokens: dict[tuple[str, str], int] = {}
        self._waits: dict[str, list[float]] = {}

    def add(self, ctx: RequestContext) -> None:
        counts, model = self._counts, ctx.model
        key = (ctx.route, model, ctx.status)
        counts[key] = counts.get(key, 0) + 1
        found = self._latencies.get(ctx.route)
        if found is None:
            found = self._latencies[ctx.route] = []
        found.append(ctx.elapsed)
        if ctx.ttft is not None:
            found = self._ttfts.get(model)
            if found is None:
                found = self._ttfts[model] = []
            found.append(ctx.ttft)
        if ctx.prompt_tokens or ctx.completion_tokens:
            tokens = self._tokens
            tokens[(model, "prompt")] = tokens.get((model, "prompt"), 0) + ctx.prompt_tokens
            completion = (model, "completion")
            tokens[completion] = tokens.get(completion, 0) + ctx.completion_tokens
        if ctx.queue_wait is not None:
            found = self._waits.get(ctx.priority_class)
            if found is None:
                found = self._waits[ctx.priority_class] = []
            found.append(ctx.queue_wait)

    def drain_into(
        self,
        requests: BatchedCounter,
        latency: BatchedHistogram,
        ttft: BatchedHistogram,
        tokens: BatchedCounter,
        queue_wait: BatchedHistogram,
    ) -> None:
        """Move everything added so far into the batches, and start again."""
        for (route, model, status), count in self._counts.items():
            requests.add((route, model, str(status)), count)
        for labels, amount in self._tokens.items():
            tokens.add(labels, amount)
        for histogram, values in (
            (latency, self._latencies),
            (ttft, self._ttfts),
            (queue_wait, self._waits),
        ):
            for label, observed in values.items():
                histogram.observe_many((label,), observed)
        self._reset()
