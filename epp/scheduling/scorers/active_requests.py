"""``active-request-scorer``: min-max over the requests the picker itself has in flight at each
endpoint (sent and not yet finished) per unit of its capacity, fewer is better; all equal score 1.

Unlike the scraped queue and running counts it moves the moment a request is sent or ends,
long before anything queues: the load signal for choosing between endpoints that are otherwise
alike (llm-d's ``active-request-scorer``).
"""

from __future__ import annotations

from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.params import Parameterless
from epp.scheduling.scorers.queue import min_max_low_is_best


class ActiveRequestScorer(Parameterless):
    """Scores by the picker's own in-flight count, min-max scaled: the fewest score 1."""

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        return min_max_low_is_best({e.address: e.in_flight / e.capacity for e in endpoints})
