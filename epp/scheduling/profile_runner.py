"""One scheduling cycle of a profile: filters → weighted scorers (clamped to [0, 1]) → picker."""

from __future__ import annotations

from itertools import repeat

from epp.framework import Endpoint, Profile, SchedulingRequest, SchedulingResult


def clamp(value: float) -> float:
    return 0.0 if value < 0.0 else 1.0 if value > 1.0 else value


class ProfileRunner:
    """Runs one profile over candidates; it learns nothing (``EppService.dispatched`` does)."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile

    def schedule(self, request: SchedulingRequest, candidates: list[Endpoint]) -> SchedulingResult:
        endpoints = candidates
        kept: list[tuple[str, list[Endpoint]]] = [("", candidates)]
        for plugin in self.profile.filters:
            endpoints = plugin.filter(request, endpoints)
            kept.append((plugin.name, endpoints))
            if not endpoints:
                return SchedulingResult([], {}, "", [], kept)
        addresses = [e.address for e in endpoints]
        totals = [0.0] * len(addresses)  # aligned with `endpoints`: list arithmetic, not dicts
        parts: list[tuple[str, float, dict[str, float]]] = []  # scorer, weight, raw scores
        for weighted in self.profile.scorers:
            scores = weighted.scorer.score(request, endpoints)
            weight = weighted.weight
            parts.append((weighted.scorer.name, weight, scores))
            if not scores:
                continue
            values = list(map(scores.get, addresses, repeat(0.0)))
            if min(values) < 0.0 or max(values) > 1.0:  # the framework clamps misbehaving scorers
                values = [clamp(v) for v in values]
            totals = [total + weight * v for total, v in zip(totals, values, strict=True)]
        ranked = self.profile.picker.pick(request, list(zip(endpoints, totals, strict=True)))
        winner_by = ""
        if ranked and parts:
            best = ranked[0].address
            winner_by = max(parts, key=lambda p: p[1] * clamp(p[2].get(best, 0.0)))[0]
        totals_by = dict(zip(addresses, totals, strict=True))
        return SchedulingResult(ranked, totals_by, winner_by, parts, kept)
