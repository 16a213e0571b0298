"""``max-score-picker``: highest total score first; ties broken at random, as GIE does (GIE
shuffles, then sorts stably; here each endpoint gets a random second sort key: the same order
distribution, without a Python-level shuffle). Where endpoints differ in capacity, the key is
``u ** (1 / capacity)`` (Efraimidis and Spirakis' weighted sampling): of tied endpoints, one of
capacity 3 comes first three times as often as one of capacity 1."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.params import parse_params


@dataclass(frozen=True)
class Params:
    seed: int = -1  # -1: unseeded


class MaxScorePicker:
    """Ranks by total score, highest first; ties in random order."""

    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self._random = random.Random(None if params.seed < 0 else params.seed)

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> Params:
        return parse_params(Params, name, raw)

    @classmethod
    def from_config(cls, name: str, raw: Mapping[str, object]) -> MaxScorePicker:
        return cls(name, cls.parse_config(name, raw))

    def pick(
        self, request: SchedulingRequest, scored: list[tuple[Endpoint, float]]
    ) -> list[Endpoint]:
        rand = self._random.random
        keys = sorted(
            zip(
                [score for _, score in scored],
                [rand() if (c := e.capacity) == 1.0 else rand() ** (1.0 / c) for e, _ in scored],
                range(len(scored)),
                strict=True,
            ),
            reverse=True,
        )
        return [scored[index][0] for _, _, index in keys]
