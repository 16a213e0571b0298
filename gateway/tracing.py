"""OpenTelemetry tracing: spans for the request, auth, routing and the upstream call.

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
