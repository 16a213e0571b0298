"""Per-request state that the handlers fill in, read by logs, metrics and traces."""

from __future__ import annotations

import time

from gateway.base.identity import Identity


class RequestContext:
    """One request's facts, filled in as it goes (a plain slots class: one is made per request)."""

    __slots__ = (
        "attempts",
        "cache",
        "cached_tokens",
        "canary_arm",
        "completion_tokens",
        "cors",
        "deadline",
        "elapsed",
        "endpoint",
        "error",
        "explain",
        "explanation",
        "extra_headers",
        "identity",
        "model",
        "pool",
        "priority_class",
        "prompt_tokens",
        "queue_wait",
        "request_id",
        "route",
        "start",
        "status",
        "stream",
        "ttft",
        "usage_known",
    )

    def __init__(self, request_id: str, route: str = "") -> None:
        self.request_id = request_id
        self.route = route  # the request's path, the metrics' route label
        self.start = time.perf_counter()
        self.elapsed = 0.0  # seconds to the end of the response, set when it is recorded
        self.identity: Identity | None = None
        self.model = ""  # the public model the client asked for
        self.pool = ""
        self.endpoint = ""  # host:port that served the request
        self.attempts = 0
        self.status = 0
        self.stream = False
        self.ttft: float | None = None  # seconds to the first body byte sent to the client
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0  # of the prompt's, those the engine's prefix cache held
        self.error = ""  # kind of failure, for logs
        self.usage_known = False  # the upstream reported usage (prompt and completion tokens)
        self.priority_class = ""  # the admission class, once queued
        self.queue_wait: float | None = None  # seconds waited for capacity, once admitted
        self.deadline: float | None = None  # seconds from arrival the client gave it to start in
        self.extra_headers: dict[str, str] | None = None  # added to the client's response
        self.cors = b""  # the response's CORS header lines (policy cors:, allowed origins)
        self.canary_arm = ""  # the pool an automatic canary's route chose
        self.cache = ""  # the response cache's verdict: hit, miss, bypass ("" without one)
        self.explain = ""  # the routing decision is explained: "reply", "log" or not ""
        self.explanation: dict[str, object] | None = None  # ... as it was made

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first, of a stream of two tokens or more."""
        ttft = self.ttft
        if ttft is None or not self.stream or self.completion_tokens < 2:
            return None
        return (self.elapsed - ttft) / (self.completion_tokens - 1)

    @property
    def tenant(self) -> str:
        return self.identity.tenant if self.identity else ""

    def add_headers(self, headers: dict[str, str]) -> None:
        """Headers for the client's response (rate limits, A/B arm)."""
        if self.extra_headers is None:
            self.extra_headers = {}
        self.extra_headers.update(headers)
