"""``queue-scorer``: (max - q) / (max - min) over the endpoints' waiting queues (GIE's).

Every endpoint scores 1.0 when all queues are equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from epp.framework import Endpoint, SchedulingRequest
from epp.params import parse_params


@dataclass(frozen=True)
class Params:
    pass


class QueueScorer:
    """Scores by waiting queue, min-max scaled: the shortest queue scores 1."""

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> Params:
        return parse_params(Params, name, raw)

    @classmethod
    def from_config(cls, name: str, raw: Mapping[str, object]) -> QueueScorer:
        cls.parse_config(name, raw)
        return cls(name)

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        return min_max_low_is_best({e.address: e.metrics.waiting for e in endpoints})


def min_max_low_is_best(values: dict[str, int]) -> dict[str, float]:
    """Scale so the lowest value scores 1 and the highest 0."""
    if not values:
        return {}
    low, high = min(values.values()), max(values.values())
    if high == low:
        return dict.fromkeys(values, 1.0)
    return {address: (high - v) / (high - low) for address, v in values.items()}
