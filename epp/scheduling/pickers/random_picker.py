"""``random-picker``: a uniformly random order, ignoring scores (a baseline)."""

from __future__ import annotations

import random
from collections.abc import Mapping

from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.params import parse_params
from epp.scheduling.pickers.max_score import Params


class RandomPicker:
    """Ranks in a uniformly random order (a baseline that ignores scores)."""

    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self._random = random.Random(None if params.seed < 0 else params.seed)

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> Params:
        return parse_params(Params, name, raw)

    @classmethod
    def from_config(cls, name: str, raw: Mapping[str, object]) -> RandomPicker:
        return cls(name, cls.parse_config(name, raw))

    def pick(
        self, request: SchedulingRequest, scored: list[tuple[Endpoint, float]]
    ) -> list[Endpoint]:
        order = [endpoint for endpoint, _ in scored]
        self._random.shuffle(order)
        return order
