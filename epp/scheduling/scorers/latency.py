"""``latency-scorer``: each endpoint's predicted time to this request's first token (low is
best), from the pool's TTFT model (``epp.datalayer.latency_model``), which the picker trains
with every first token that comes back.

The prediction reads what the token backlog reads (prompt tokens ahead there, and this request's
own uncached ones, from the EPP's first prefix index; output tokens owed there) and the requests
in flight there, weighed by what the pool's endpoints were seen to take rather than by fixed
ratios. Scores are min-max scaled; endpoints whose predictions differ by less than ``spread``
seconds score in proportion to it (so that noise in a small difference does not decide).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from epp.datalayer.latency_model import LatencyModel
from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.handle import PluginHandle
from epp.scheduling.params import parse_params
from epp.scheduling.scorers.queue import min_max_low_is_best


@dataclass(frozen=True)
class Params:
    spread: float = 0.05  # seconds: a smaller spread of predictions scores in proportion to it


class LatencyScorer:
    """Scores by predicted TTFT (the lowest scores 1)."""

    def __init__(self, name: str, params: Params, handle: PluginHandle) -> None:
        self.name = name
        self.params = params
        self._handle = handle
        self.model: LatencyModel = handle.latency_model()

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> Params:
        return parse_params(Params, name, raw, {"spread": lambda v: v > 0})

    @classmethod
    def from_config(
        cls, name: str, raw: Mapping[str, object], handle: PluginHandle
    ) -> LatencyScorer:
        return cls(name, cls.parse_config(name, raw), handle)

    def predictions(
        self, request: SchedulingRequest, endpoints: list[Endpoint]
    ) -> dict[str, float]:
        """Seconds to the first token of ``request`` on each endpoint, by address."""
        index, model = self._handle.primary_index, self.model
        owns = index.uncached_tokens_each(request, endpoints) if index else [0] * len(endpoints)
        return {
            e.address: model.predict(e.pool, model.features(e, own))
            for e, own in zip(endpoints, owns, strict=True)
        }

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        return min_max_low_is_best(self.predictions(request, endpoints), self.params.spread)
