"""OpenTelemetry tracing: spans for the request, auth, the limits, the admission wait, the
routing decision, each upstream attempt (and prefill hop), and the shadow copy.

With the ``none`` exporter no tracer exists and nothing is recorded; the client's own
``traceparent`` still reaches the upstream unchanged. Otherwise the gateway continues the
client's trace (or starts one) and sends its own ``traceparent`` upstream.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio

from gateway.embedded_epp import EppRanking
from gateway.endpoint_picker import Ranking
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


def decision_attributes(ranking: Ranking) -> dict[str, str | int | float]:
    """The routing decision as span attributes: the embedded picker's explanation; other
    pickers (least in flight) decide nothing worth recording."""
    return ranking.explain() if isinstance(ranking, EppRanking) else {}
