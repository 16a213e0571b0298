"""``zone-affinity-scorer``: the nearest endpoints first, while they have room.

The picker knows where it runs (``epp.zone``, ``epp.region``) and each endpoint where it does
(its ``labels``: ``zone``, ``region``). An endpoint with room scores 1 in the picker's zone,
0.75 in its region, 0.5 anywhere else (one without a zone label counts as in the zone); a
saturated one (the pool's saturation thresholds, as the saturation filter reads them) scores 0
while any candidate has room. So a request stays in its zone until the zone is full, then
spills to the nearest zone with room; when every endpoint is saturated, nearness alone decides.
``kvgate_epp_cross_zone_picks_total`` counts the requests sent out of the zone (where they went:
a first choice in the zone that a breaker skipped does not hide the crossing).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.handle import PluginHandle
from epp.scheduling.params import Parameterless
from epp.scheduling.saturation import SaturationDetector


def in_zone(endpoint: Endpoint, zone: str) -> bool:
    """Whether ``endpoint`` is in ``zone``: its label says so, or it has none (every endpoint
    is, where the picker's zone is unknown)."""
    label = endpoint.spec.labels.get("zone")
    return not zone or label is None or label == zone


class ZoneAffinityScorer:
    """Scores by nearness to the picker (1 its zone, 0.75 its region, 0.5 elsewhere), 0 when
    saturated while another candidate is not."""

    def __init__(self, name: str, zone: str, region: str, detector: SaturationDetector) -> None:
        self.name = name
        self.zone = zone
        self.region = region
        self.detector = detector

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> None:
        Parameterless.parse_config(name, raw)

    @classmethod
    def from_config(
        cls, name: str, raw: Mapping[str, object], handle: PluginHandle
    ) -> ZoneAffinityScorer:
        cls.parse_config(name, raw)
        return cls(name, handle.zone, handle.region, handle.saturation)

    def nearness(self, endpoint: Endpoint) -> float:
        if in_zone(endpoint, self.zone):
            return 1.0
        region = endpoint.spec.labels.get("region")
        return 0.75 if self.region and region == self.region else 0.5

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        room = {e.address for e in self.detector.unsaturated(endpoints, time.monotonic())}
        return {
            e.address: self.nearness(e) if not room or e.address in room else 0.0 for e in endpoints
        }
