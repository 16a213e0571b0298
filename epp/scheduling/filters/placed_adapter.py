"""``placed-adapter-filter``: where the gateway loads a pool's LoRA adapters itself
(``gateway.routing.adapter_placement``), keep the endpoints that have the request's adapter loaded
(or loading) and are not saturated. Another endpoint would first have to load it, and unload another
adapter to make room, so an adapter spreads to more endpoints only when those holding it are
saturated. Without gateway-placed adapters, or when no unsaturated endpoint holds it, every endpoint
stays."""

from __future__ import annotations

import time

from epp.datalayer.placement import holding
from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.filters.saturation import SaturationFilter


class PlacedAdapterFilter(SaturationFilter):
    """Keeps the unsaturated endpoints that hold the request's adapter, when any does (the
    saturation filter's configuration and detector, over those endpoints)."""

    def filter(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        if request.lora is None:
            return endpoints
        held = holding(endpoints, request.lora)
        return (held and self.detector.unsaturated(held, time.monotonic())) or endpoints
