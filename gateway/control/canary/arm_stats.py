"""What one arm of a canary (baseline or canary pool) served during the current step."""

from __future__ import annotations

import random

from gateway.control.outcomes import counted, failed, succeeded

SAMPLES = 10_000  # latencies kept per arm and metric (a uniform sample beyond that)


class Reservoir:
    """A uniform sample of at most ``SAMPLES`` values (Vitter's algorithm R)."""

    __slots__ = ("rng", "seen", "values")

    def __init__(self, rng: random.Random) -> None:
        self.values: list[float] = []
        self.seen = 0
        self.rng = rng

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < SAMPLES:
            self.values.append(value)
            return
        slot = self.rng.randrange(self.seen)
        if slot < SAMPLES:
            self.values[slot] = value

    def quantile(self, q: float) -> float | None:
        if not self.values:
            return None
        ordered = sorted(self.values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class ArmStats:
    __slots__ = ("errors", "requests", "tpot", "ttft")

    def __init__(self, rng: random.Random) -> None:
        self.requests = 0  # but those the client gave up on
        self.errors = 0  # answered with a 5xx (the gateway's own included)
        self.ttft = Reservoir(rng)  # successful requests
        self.tpot = Reservoir(rng)  # successful streams of two tokens or more

    def observe(self, status: int, ttft: float | None, tpot: float | None) -> None:
        if not counted(status):
            return
        self.requests += 1
        if failed(status):
            self.errors += 1
        elif succeeded(status):
            if ttft is not None:
                self.ttft.add(ttft)
            if tpot is not None:
                self.tpot.add(tpot)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def summary(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": round(self.error_rate, 6),
            "ttft_p95": self.ttft.quantile(0.95),
            "tpot_p95": self.tpot.quantile(0.95),
        }
