"""``max-score-picker``: highest total score first; ties broken at random (shuffle, then a
stable sort), as GIE does."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from epp.framework import Endpoint, SchedulingRequest
from epp.params import parse_params


@dataclass(frozen=True)
class Params:
    seed: int = -1  # -1: unseeded


class MaxScorePicker:
    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self._random = random.Random(None if params.seed < 0 else params.seed)

    @classmethod
    def from_config(cls, name: str, raw: Mapping[str, object]) -> MaxScorePicker:
        return cls(name, parse_params(Params, name, raw))

    def pick(
        self, request: SchedulingRequest, scored: list[tuple[Endpoint, float]]
    ) -> list[Endpoint]:
        shuffled = list(scored)
        self._random.shuffle(shuffled)
        shuffled.sort(key=lambda pair: pair[1], reverse=True)
        return [endpoint for endpoint, _ in shuffled]
