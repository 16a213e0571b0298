"""``saturation-filter``: drop saturated endpoints, unless every candidate is saturated (then
all stay, and the admission queue, not this filter, decides whether to wait)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from epp.framework import Endpoint, SchedulingRequest
from epp.params import parse_params
from epp.saturation import SaturationDetector, SaturationThresholds


@dataclass(frozen=True)
class Params:
    queue_depth: int = 5
    kv_usage: float = 0.8
    max_metrics_age: float = 0.2


class SaturationFilter:
    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.detector = SaturationDetector(
            SaturationThresholds(params.queue_depth, params.kv_usage, params.max_metrics_age)
        )

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> Params:
        checks = {
            "queue_depth": lambda v: v > 0,
            "kv_usage": lambda v: 0 < v <= 1,
            "max_metrics_age": lambda v: v > 0,
        }
        return parse_params(Params, name, raw, checks)

    @classmethod
    def from_config(cls, name: str, raw: Mapping[str, object]) -> SaturationFilter:
        return cls(name, cls.parse_config(name, raw))

    def filter(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        now = time.monotonic()
        return self.detector.unsaturated(endpoints, now) or endpoints
