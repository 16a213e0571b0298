"""OpenTelemetry tracing: spans for the request, auth, the limits, the admission wait, the
routing decision, each upstream attempt (and prefill hop), and the shadow copy.

With the ``none`` exporter no tracer exists and nothing is recorded; the client's own
``traceparent`` still reaches the upstream unchanged. Otherwise the gateway continues the
client's trace (or starts one) and sends its own ``traceparent`` upstream.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from contextlib import AbstractContextManager

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio

from gateway.routing.embedded_epp import EppRanking
from gateway.routing.endpoint_picker import Ranking
from policies.schema import Tracing


def make_tracer(config: Tracing) -> tuple[trace.Tracer | None, TracerProvider | None]:
    if config.exporter == "none":
        return None, None
    exporter: SpanExporter
    if config.exporter == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=config.endpoint)
    provider = TracerProvider(
        resource=Resource.create({"service.name": config.service_name}),
        sampler=ParentBasedTraceIdRatio(config.sample),
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider.get_tracer("kvgate.gateway"), provider


def span(
    tracer: trace.Tracer | None, name: str, attributes: Mapping[str, str | int] | None = None
) -> AbstractContextManager[object]:
    """A span of ``name`` made current while the block runs; nothing without a tracer."""
    if tracer is None:
        return contextlib.nullcontext()
    return tracer.start_as_current_span(name, attributes=attributes)


def decision_attributes(ranking: Ranking, top: int = 3) -> dict[str, str | int | float]:
    """The routing decision as span attributes (the embedded picker's explanation; other
    pickers, least in flight, decide nothing worth recording): the pick, the scorer that
    decided, the ``top`` candidates' totals and the prompt tokens the pick holds."""
    if not isinstance(ranking, EppRanking):
        return {}
    explained = ranking.explanation(top)
    if not explained or explained["pick"] is None:
        return {}
    found: dict[str, str | int | float] = {
        "kvgate.route.endpoint": str(explained["pick"]),
        "kvgate.route.deciding_scorer": str(explained["decided_by"]),
    }
    candidates = explained["candidates"]
    assert isinstance(candidates, list)
    for rank, candidate in enumerate(candidates):
        found[f"kvgate.route.candidate.{rank}"] = candidate["endpoint"]
        found[f"kvgate.route.candidate.{rank}.score"] = candidate["total"]
    prefix = explained.get("prefix")
    if isinstance(prefix, dict):
        found["kvgate.route.prompt_tokens"] = prefix["prompt_tokens"]
        found["kvgate.route.prefix_match_tokens"] = prefix["matched_tokens"]
    return found
