"""``token-backlog-scorer``: the work an endpoint has ahead of this request, and the request's own
(not GIE's ``token-load-scorer``, which scores in-flight tokens against a fixed threshold).

Each endpoint's load is the tokens the picker itself sent there and that are not done (its
``prefill_tokens``, prompt tokens not cached there whose first token has not come back, plus
``decode_weight`` x its ``decode_tokens``, output still owed), plus the prompt tokens this
request would have to compute there (what the prefix index says that endpoint does not hold).
The sum is divided by the endpoint's capacity (a time to get through it, where capacities are
relative speeds). Fewest is best, scaled over the request's own prompt: endpoints whose loads
differ by less than the whole prompt score in proportion. So a request stays where its prefix
is cached until that endpoint's backlog exceeds what a cache miss elsewhere would cost, then
goes where the load is (llm-d's "sticky until saturated"), with the threshold in the request's
own tokens: no prefill rate to calibrate while the endpoints are alike.

Without a prefix index every request counts as uncached everywhere: the scorer then ranks by
backlog alone. It reads the EPP's first prefix index (list a ``prefix-cache-scorer`` too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.handle import PluginHandle
from epp.scheduling.params import parse_params


@dataclass(frozen=True)
class Params:
    decode_weight: float = 1.0  # an owed output token's weight against a prompt token's


class TokenBacklogScorer:
    """Scores by tokens of work ahead plus this request's uncached prompt (the fewest score 1)."""

    def __init__(self, name: str, params: Params, handle: PluginHandle) -> None:
        self.name = name
        self.params = params
        self._handle = handle

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> Params:
        return parse_params(Params, name, raw, {"decode_weight": lambda v: v >= 0})

    @classmethod
    def from_config(
        cls, name: str, raw: Mapping[str, object], handle: PluginHandle
    ) -> TokenBacklogScorer:
        return cls(name, cls.parse_config(name, raw), handle)

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        index = self._handle.primary_index
        weight = self.params.decode_weight
        owns = index.uncached_tokens_each(request, endpoints) if index else [0] * len(endpoints)
        backlog = {
            e.address: (e.load.prefill_tokens + weight * e.load.decode_tokens + own) / e.capacity
            for e, own in zip(endpoints, owns, strict=True)
        }
        prompt = max(1, max(owns, default=0))
        if index is not None:
            prompt = max(prompt, index.prompt_tokens(request))
        low, high = min(backlog.values(), default=0.0), max(backlog.values(), default=0.0)
        span = max(high - low, prompt)
        return {address: (high - value) / span for address, value in backlog.items()}
