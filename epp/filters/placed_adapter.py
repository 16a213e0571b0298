"""``placed-adapter-filter``: where the gateway loads a pool's LoRA adapters itself
(``gateway.adapter_placement``), keep the endpoints that have the request's adapter loaded (or
loading) and are not saturated. Another endpoint would first have to load it, and unload
another adapter to make room, so an adapter spreads to more endpoints only when those holding it
are saturated. Without gateway-placed adapters, or when no unsaturated endpoint holds it, every
endpoint stays."""

from __future__ import annotations

import time
from collections.abc import Mapping

from epp.framework import Endpoint, SchedulingRequest
from epp.handle import PluginHandle
from epp.params import ParamError
from epp.placement import holding
from epp.saturation import SaturationDetector


class PlacedAdapterFilter:
    """Keeps the unsaturated endpoints that hold the request's adapter, when any does."""

    def __init__(self, name: str, detector: SaturationDetector) -> None:
        self.name = name
        self.detector = detector

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> None:
        if raw:
            raise ParamError(f"{name}: this filter takes no parameters")

    @classmethod
    def from_config(
        cls, name: str, raw: Mapping[str, object], handle: PluginHandle
    ) -> PlacedAdapterFilter:
        cls.parse_config(name, raw)
        return cls(name, handle.saturation)

    def filter(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        if request.lora is None:
            return endpoints
        held = holding(endpoints, request.lora)
        return (held and self.detector.unsaturated(held, time.monotonic())) or endpoints
