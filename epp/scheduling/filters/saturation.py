"""``saturation-filter``: drop saturated endpoints, unless every candidate is saturated (then
all stay, and the admission queue, not this filter, decides whether to wait).

Its thresholds are the policy's ``epp.saturation`` (through the plugin handle), so the filter,
the gateway's admission gate and ext_proc's shedding agree on what "saturated" means.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Self

from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.handle import PluginHandle
from epp.scheduling.params import ParamError
from epp.scheduling.saturation import SaturationDetector

MOVED = ("queue_depth", "kv_usage", "max_metrics_age")


class SaturationFilter:
    """Keeps the endpoints that are not saturated (all of them when every one is)."""

    def __init__(self, name: str, detector: SaturationDetector) -> None:
        self.name = name
        self.detector = detector

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> None:
        for key in raw:
            if key in MOVED:
                raise ParamError(
                    f"{name}.{key}: saturation thresholds are set once, in epp.saturation.{key}"
                )
            raise ParamError(f"{name}: unknown parameter {key!r} (this filter takes none)")

    @classmethod
    def from_config(cls, name: str, raw: Mapping[str, object], handle: PluginHandle) -> Self:
        cls.parse_config(name, raw)
        return cls(name, handle.saturation)

    def filter(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        now = time.monotonic()
        return self.detector.unsaturated(endpoints, now) or endpoints
