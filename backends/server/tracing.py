"""OpenTelemetry spans of the engine's requests (``--otlp-traces-endpoint``, vLLM's flag).

Each finished request is one ``llm_request`` server span, continuing the caller's W3C
``traceparent`` (the gateway's attempt), with vLLM's ``gen_ai.*`` attributes (queue time, time
to first token, end to end, prompt and cached and completion tokens) and three children from
the engine's own clock: ``queue`` (arrival to first scheduled), ``prefill`` (to the first token;
the prompt tokens it found cached) and ``decode`` (to the last token).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.propagate import extract
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from backends.engine.engine import RequestStream


class RequestTracer:
    """Emits each finished request's spans to an OTLP/HTTP collector."""

    def __init__(self, exporter: SpanExporter, service_name: str = "kvgate-backend") -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("kvgate.backend")

    @classmethod
    def otlp(cls, endpoint: str, model: str) -> RequestTracer:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return cls(OTLPSpanExporter(endpoint=endpoint), f"kvgate-backend {model}")

    def record(self, headers: Mapping[str, str], stream: RequestStream, model: str) -> None:
        """The spans of one request whose stream is over (nothing for one never scheduled)."""
        seq = stream.seq
        if seq.scheduled_time == 0.0:
            return
        wall = time.time_ns() - time.monotonic_ns()  # monotonic to wall-clock nanoseconds

        def at(monotonic: float) -> int:
            return wall + int(monotonic * 1e9)

        arrival, scheduled = seq.arrival_time, seq.scheduled_time
        first = stream.first_token_time or stream.last_token_time or scheduled
        last = stream.last_token_time or first
        span = self.tracer.start_span(
            "llm_request",
            context=extract(headers),
            kind=trace.SpanKind.SERVER,
            start_time=at(arrival),
            attributes={
                "gen_ai.request.id": seq.request_id,
                "gen_ai.response.model": model,
                "gen_ai.usage.prompt_tokens": seq.num_prompt_tokens,
                "gen_ai.usage.completion_tokens": seq.num_output_tokens,
                "gen_ai.usage.cached_tokens": seq.num_cached_tokens,
                "gen_ai.latency.time_in_queue": scheduled - arrival,
                "gen_ai.latency.time_to_first_token": first - arrival,
                "gen_ai.latency.e2e": last - arrival,
                "gen_ai.latency.time_in_model_prefill": first - scheduled,
                "gen_ai.latency.time_in_model_decode": last - first,
            },
        )
        parent = trace.set_span_in_context(span)
        for name, start, end, attributes in (
            ("queue", arrival, scheduled, {}),
            ("prefill", scheduled, first, {"gen_ai.usage.cached_tokens": seq.num_cached_tokens}),
            ("decode", first, last, {"gen_ai.usage.completion_tokens": seq.num_output_tokens}),
        ):
            child = self.tracer.start_span(
                name, context=parent, start_time=at(start), attributes=attributes
            )
            child.end(end_time=at(end))
        span.end(end_time=at(last))

    def close(self) -> None:
        self.provider.shutdown()
