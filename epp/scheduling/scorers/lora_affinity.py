"""``lora-affinity-scorer`` (GIE's values): 1.0 if the request's adapter is running on the
endpoint (or the gateway loaded it there: ``Endpoint.adapters_loaded``); 0.8 if a slot is free
(running + waiting adapters < max_lora; where the gateway places adapters, loaded ones < its
``max_adapters``); 0.6 if the adapter is waiting there; 0 otherwise.
Requests without an adapter score 1.0 everywhere."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.params import parse_params


@dataclass(frozen=True)
class Params:
    active: float = 1.0
    free_slot: float = 0.8
    loading: float = 0.6


class LoraAffinityScorer:
    """Prefers endpoints where the request's adapter runs, then those with a free adapter slot."""

    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> Params:
        in_unit = {k: (lambda v: 0.0 <= v <= 1.0) for k in ("active", "free_slot", "loading")}
        return parse_params(Params, name, raw, in_unit)

    @classmethod
    def from_config(cls, name: str, raw: Mapping[str, object]) -> LoraAffinityScorer:
        return cls(name, cls.parse_config(name, raw))

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        if request.lora is None:
            return {e.address: 1.0 for e in endpoints}
        return {e.address: self._one(request.lora, e) for e in endpoints}

    def _one(self, lora: str, endpoint: Endpoint) -> float:
        m = endpoint.metrics
        if lora in m.running_loras or lora in endpoint.adapters_loaded:
            return self.params.active
        if endpoint.adapter_slots:  # the gateway loads them: a slot is free, or one must go
            free = len(endpoint.adapters_loaded) < endpoint.adapter_slots
            return self.params.free_slot if free else 0.0
        if len(m.running_loras | m.waiting_loras) < m.max_loras:
            return self.params.free_slot
        if lora in m.waiting_loras:
            return self.params.loading
        return 0.0
