"""``session-affinity-scorer``: 1.0 for the endpoint that served the request's session last
(``x-session-id`` header by default), 0 elsewhere; sessions are forgotten LRU-first."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from epp.framework import Endpoint, SchedulingRequest
from epp.params import parse_params


@dataclass(frozen=True)
class Params:
    max_sessions: int = 100_000


class SessionAffinityScorer:
    """Scores 1 for the endpoint that last served the request's session; learns dispatched picks."""

    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params
        self._sessions: OrderedDict[str, str] = OrderedDict()

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> Params:
        return parse_params(Params, name, raw, {"max_sessions": lambda v: v > 0})

    @classmethod
    def from_config(cls, name: str, raw: Mapping[str, object]) -> SessionAffinityScorer:
        return cls(name, cls.parse_config(name, raw))

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        last = self._sessions.get(request.session_id) if request.session_id else None
        return {e.address: 1.0 if e.address == last else 0.0 for e in endpoints}

    def on_pick(self, request: SchedulingRequest, endpoint: Endpoint) -> None:
        if request.session_id:
            self._sessions[request.session_id] = endpoint.address
            self._sessions.move_to_end(request.session_id)
            if len(self._sessions) > self.params.max_sessions:
                self._sessions.popitem(last=False)
