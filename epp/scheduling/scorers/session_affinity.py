"""``session-affinity-scorer``: 1.0 for the endpoint that served the request's session last,
0 elsewhere; sessions are forgotten LRU-first. A request's session is its ``x-session-id``
header, its ``user`` field, or its first chat turn (``epp.scheduling.session_key``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from epp.framework import Endpoint, RequestMemo, SchedulingRequest
from epp.scheduling.params import parse_params
from epp.scheduling.session_key import session_key


@dataclass(frozen=True)
class Params:
    max_sessions: int = 100_000


class SessionAffinityScorer:
    """Scores 1 for the endpoint that last served the request's session; learns dispatched picks."""

    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._memo: RequestMemo[str] = RequestMemo()  # "" for a request with no session

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> Params:
        return parse_params(Params, name, raw, {"max_sessions": lambda v: v > 0})

    @classmethod
    def from_config(cls, name: str, raw: Mapping[str, object]) -> SessionAffinityScorer:
        return cls(name, cls.parse_config(name, raw))

    def _session(self, request: SchedulingRequest) -> str:
        """The request's session, worked out once for its scoring and its pick."""
        session = self._memo.get(request)
        if session is None:
            session = self._memo.put(request, session_key(request.body, request.headers) or "")
        return session

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        session = self._session(request)
        last = self._sessions.get(session) if session else None
        return {e.address: 1.0 if e.address == last else 0.0 for e in endpoints}

    def on_pick(self, request: SchedulingRequest, endpoint: Endpoint) -> None:
        session = self._session(request)
        if session:
            self._sessions[session] = endpoint.address
            self._sessions.move_to_end(session)
            if len(self._sessions) > self.params.max_sessions:
                self._sessions.popitem(last=False)
