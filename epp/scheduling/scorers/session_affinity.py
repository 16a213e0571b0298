"""``session-affinity-scorer``: 1.0 for the endpoint that served the request's session last,
0 elsewhere; sessions are forgotten LRU-first. A request's session comes from what clients
and agents send (Claude Code's session header, ``prompt_cache_key``, ``x-session-id``,
Anthropic's ``metadata.user_id``, ``user``) or its first chat turn
(``epp.scheduling.session_key``).

Affinity stands in for the prefix index, never on top of it: where the index already tells the
session's endpoint apart (it holds more of the prompt than every other candidate), the prefix
scorer credits the history cached there and this one scores 0, so the two never add up to a pull
the backlog cannot outweigh (prefix x3 and session x2 against backlog x2 and active x1); where
the index has let go of it, this one says where the history is. And affinity never overrides
saturation: a session whose endpoint is saturated scores 0 there, so a hot session spreads like
any other request until its endpoint has room. Other workers' and replicas' picks of a session
are learned as this picker's own (through the pick exchange, or the replicas' shared picks), so
a session's next call finds its endpoint whichever gateway it reaches."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from epp.framework import Endpoint, RequestMemo, SchedulingRequest
from epp.scheduling.handle import PluginHandle
from epp.scheduling.params import parse_params
from epp.scheduling.saturation import SaturationDetector
from epp.scheduling.session_key import session_key


@dataclass(frozen=True)
class Params:
    max_sessions: int = 100_000


class SessionAffinityScorer:
    """Scores 1 for the endpoint that last served the request's session (unless it is
    saturated); learns dispatched picks, this picker's and its siblings'."""

    def __init__(
        self, name: str, params: Params, saturation: SaturationDetector | None = None
    ) -> None:
        self.name = name
        self.params = params
        self._saturation = saturation or SaturationDetector()
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._memo: RequestMemo[str] = RequestMemo()  # "" for a request with no session

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> Params:
        return parse_params(Params, name, raw, {"max_sessions": lambda v: v > 0})

    @classmethod
    def from_config(
        cls, name: str, raw: Mapping[str, object], handle: PluginHandle | None = None
    ) -> SessionAffinityScorer:
        saturation = handle.saturation if handle is not None else None
        return cls(name, cls.parse_config(name, raw), saturation)

    def session_of(self, request: SchedulingRequest) -> str:
        """The request's session ("" for none), worked out once for its scoring and its pick."""
        session = self._memo.get(request)
        if session is None:
            key = session_key(request.body, request.headers, request.tenant)
            session = self._memo.put(request, key or "")
        return session

    def session_home(self, request: SchedulingRequest) -> str | None:
        session = self.session_of(request)
        return self._sessions.get(session) if session else None

    def score(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        last = self.session_home(request)
        scores = dict.fromkeys([e.address for e in endpoints], 0.0)
        if last in scores and not _told_apart(request.prefix_match, last, scores):
            home = next(e for e in endpoints if e.address == last)
            if self._saturation.unsaturated([home], time.monotonic()):
                scores[last] = 1.0
        return scores

    def on_pick(self, request: SchedulingRequest, endpoint: Endpoint) -> None:
        session = self.session_of(request)
        if session:
            self.learn_session(session, endpoint.address)

    def learn_session(self, session: str, address: str) -> None:
        """``session`` went to ``address`` (here, or on a sibling worker or replica)."""
        self._sessions[session] = address
        self._sessions.move_to_end(session)
        if len(self._sessions) > self.params.max_sessions:
            self._sessions.popitem(last=False)


def _told_apart(matched: dict[str, float], home: str, candidates: dict[str, float]) -> bool:
    """Whether the prefix index (what it matched, filled by the prefix scorer) credits ``home``
    with more of the prompt than some other candidate: then it already pulls there."""
    held = matched.get(home, 0)
    return held > 0 and any(matched.get(a, 0) < held for a in candidates if a != home)
