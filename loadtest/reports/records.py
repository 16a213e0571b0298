"""What the load tester keeps of each request: the input of every report."""

from __future__ import annotations

from dataclasses import dataclass, field

ERROR_KINDS = ("http_4xx", "http_5xx", "stream_error", "incomplete", "connection", "timeout")


@dataclass(frozen=True)
class RequestRecord:
    """One request as the client saw it. Times are seconds: ``start`` from the run's start,
    the others from the moment the request was sent."""

    start: float
    stage: int = 0
    error_kind: str = ""  # "" when it succeeded, else one of ERROR_KINDS
    error: str = ""
    ttft: float = 0.0
    latency: float = 0.0
    itls: list[float] = field(default_factory=list)  # gaps between content chunks
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    group: str = ""  # what shares its prefix (the workload's group or session)
    index: int = -1  # the request's position in the workload (chains flattened in order)
    call: int = 0  # its position in its chain (a session's call index, from 0)
    digest: str = ""  # of the answer's text (xxh64): equal answers, equal digests

    @property
    def ok(self) -> bool:
        return not self.error_kind

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, as ``vllm bench serve`` defines it:
        (latency - TTFT) / (output tokens - 1); None for a one-token answer."""
        if self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    def as_dict(self) -> dict[str, object]:
        return {
            "start": self.start,
            "stage": self.stage,
            "error_kind": self.error_kind,
            "error": self.error,
            "ttft": self.ttft,
            "latency": self.latency,
            "itls": self.itls,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "group": self.group,
            "index": self.index,
            "call": self.call,
            "digest": self.digest,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> RequestRecord:
        def number(key: str) -> float:
            value = data.get(key, 0)
            return float(value) if isinstance(value, int | float) else 0.0

        itls = data.get("itls")
        return cls(
            start=number("start"),
            stage=int(number("stage")),
            error_kind=str(data.get("error_kind") or ""),
            error=str(data.get("error") or ""),
            ttft=number("ttft"),
            latency=number("latency"),
            itls=[float(v) for v in itls] if isinstance(itls, list) else [],
            prompt_tokens=int(number("prompt_tokens")),
            output_tokens=int(number("output_tokens")),
            cached_tokens=int(number("cached_tokens")),
            group=str(data.get("group") or ""),
            index=int(number("index")) if "index" in data else -1,
            call=int(number("call")),
            digest=str(data.get("digest") or ""),
        )
