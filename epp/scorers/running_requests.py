"""``running-requests-size-scorer``: min-max over running requests, fewer is better."""

from __future__ import annotations

from collections.abc import Mapping

from epp.framework import Endpoint, SchedulingRequest
from epp.params import parse_params
from epp.scorers.queue import Params, min_max_low_is_best


class RunningRequestsScorer:
    """Scores by running requests, min-max scaled: the fewest score 1."""

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> Params:
        return parse_params(Params, name, raw)

    @classmethod
    def from_config(cls, name: str, raw: Mapping[str, object]) -> RunningRequestsScorer:
        cls.parse_config(name, raw)
        return cls(name)

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        return min_max_low_is_best({e.address: e.metrics.running for e in endpoints})
