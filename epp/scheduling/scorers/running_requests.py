"""``running-requests-size-scorer``: min-max over running requests per unit of capacity, fewer
is better."""

from __future__ import annotations

from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.params import Parameterless
from epp.scheduling.scorers.queue import min_max_low_is_best


class RunningRequestsScorer(Parameterless):
    """Scores by running requests, min-max scaled: the fewest score 1."""

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        return min_max_low_is_best({e.address: e.metrics.running / e.capacity for e in endpoints})
