"""Per-request state that the middlewares and the proxy fill in, read by logs and metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gateway.identity import Identity


@dataclass(slots=True)
class RequestContext:
    request_id: str
    start: float = field(default_factory=time.perf_counter)
    identity: Identity | None = None
    model: str = ""  # the public model the client asked for
    pool: str = ""
    endpoint: str = ""  # host:port that served the request
    attempts: int = 0
    status: int = 0
    stream: bool = False
    ttft: float | None = None  # seconds to the first body byte sent to the client
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str = ""  # kind of failure, for logs
    usage_known: bool = False  # the upstream reported usage (prompt_tokens, completion_tokens)
    extra_headers: dict[str, str] = field(default_factory=dict)  # added to the client's response

    @property
    def tenant(self) -> str:
        return self.identity.tenant if self.identity else ""
