"""``queue-scorer``: (max - q) / (max - min) over the endpoints' waiting queues (GIE's), each
queue divided by its endpoint's capacity.

Every endpoint scores 1.0 when all queues are equal.
"""

from __future__ import annotations

from collections.abc import Mapping

from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.params import Parameterless


class QueueScorer(Parameterless):
    """Scores by waiting queue, min-max scaled: the shortest queue scores 1."""

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        return min_max_low_is_best({e.address: e.metrics.waiting / e.capacity for e in endpoints})


def min_max_low_is_best(values: Mapping[str, float], significant: float = 0) -> dict[str, float]:
    """Scale so the lowest value scores 1 and the highest 0; with ``significant``, a spread
    smaller than that scores in proportion to it instead (the lowest gets less than 1)."""
    if not values:
        return {}
    low, high = min(values.values()), max(values.values())
    span = max(high - low, significant)
    if span == 0:
        return dict.fromkeys(values, 1.0)
    return {address: (high - v) / span for address, v in values.items()}
