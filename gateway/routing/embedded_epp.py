"""The endpoint picker embedded in the gateway: the gateway's ``EndpointPicker`` contract,
backed by an in-process ``EppService``."""

from __future__ import annotations

import itertools
from typing import cast

from epp.datalayer.indexes.precise_cache import PrecisePrefixCache
from epp.framework import Endpoint, SchedulingRequest, SchedulingResult
from epp.scheduling.registry import SHARED_KNOWLEDGE
from epp.service import Dispatch, EppService
from gateway.routing.endpoint_picker import EndpointState, PickRequest, Ranking
from policies.schema import Policy


class EmbeddedEpp:
    """Ranks a pool once per request with the EPP's profiles; the ranking tells the EPP each
    endpoint it hands out, and each that refused the connection."""

    def __init__(
        self,
        policy: Policy,
        states: dict[str, list[EndpointState]],
        service: EppService | None = None,
    ) -> None:
        self.service = service or EppService(policy)
        self._states = {(s.pool, s.address): s for pool in states.values() for s in pool}
        # one in-flight count per request: the gateway's attempts keep it, the picker reads it
        self.service.share_in_flight({key: s.requests for key, s in self._states.items()})

    async def start(self) -> None:
        await self.service.start()

    async def stop(self) -> None:
        await self.service.stop()

    def prompt_token_ids(self, pool: str, request: PickRequest) -> list[int] | None:
        index = self.service.prefix
        if not isinstance(index, PrecisePrefixCache):
            return None
        return index.token_ids(self._scheduling(pool, request))

    def rank(self, pool: str, request: PickRequest) -> Ranking:
        scheduling = self._scheduling(pool, request)
        request.worked_out = None  # a later ranking (a resume) starts afresh
        decision = self.service.pick(pool, scheduling)
        states = self._states
        prefill = decision.prefill
        return EppRanking(
            self.service,
            scheduling,
            [(states[(pool, e.address)], e) for e in decision.result.ranked],
            None if prefill is None else (states[(pool, prefill.address)], prefill),
            decision.result,
        )

    def _scheduling(self, pool: str, request: PickRequest) -> SchedulingRequest:
        """What the plugins see of ``request`` for ``pool``; the one ``prompt_tokens`` made, if
        it did (what the plugins worked out, such as its tokens, is kept with it)."""
        worked_out = request.worked_out
        if worked_out is not None and worked_out[0] == pool:
            return cast(SchedulingRequest, worked_out[1])
        model = self.service.target_model(pool, request.model)
        tenant = request.identity.tenant if request.identity is not None else ""
        scheduling = self.service.scheduling_request(
            pool, request.request_id, model, request.body, request.headers, tenant
        )
        request.worked_out = (pool, scheduling)
        return scheduling


class EppRanking:
    """The EPP's ranking of one request, walked in order by the upstream call's attempts."""

    __slots__ = (
        "_cursor",
        "_dispatches",
        "_prefill",
        "_ranked",
        "_request",
        "_result",
        "_service",
    )

    def __init__(
        self,
        service: EppService,
        request: SchedulingRequest,
        ranked: list[tuple[EndpointState, Endpoint]],
        prefill: tuple[EndpointState, Endpoint] | None = None,
        result: SchedulingResult | None = None,
    ) -> None:
        self._service = service
        self._result = result
        self._request = request
        self._ranked = ranked
        self._prefill = prefill
        self._cursor = 0
        self._dispatches: list[tuple[EndpointState, Dispatch]] = []

    def explanation(self, top: int = 5, matches: bool = True) -> dict[str, object]:
        """The decision for whoever asked to read it: what each filter dropped, each scorer's
        weight and score of the ``top`` candidates with their totals, the pick, the scorer
        that decided it, and how much of the prompt the pick holds. Without ``matches``, what
        tells of other requests (the prefix held, the scores of plugins that read what every
        tenant's traffic taught the picker, the totals, the ranking and the deciding scorer)
        is withheld: a caller cannot probe whether another sent a prompt."""
        result = self._result
        if result is None:
            return {}
        dropped: dict[str, list[str]] = {}
        for (_, before), (name, after) in itertools.pairwise(result.kept):
            gone = {e.address for e in before} - {e.address for e in after}
            if gone:
                dropped[name] = sorted(gone)
        hidden = set() if matches else self._shared_knowledge()
        parts = [(name, weight, scores) for name, weight, scores in result.parts]
        candidates: list[dict[str, object]] = [
            {
                "endpoint": e.address,
                "total": round(result.scores[e.address], 4),
                "scores": {
                    name: round(scores.get(e.address, 0.0), 4)
                    for name, _, scores in parts
                    if name not in hidden
                },
            }
            for e in result.ranked[:top]
        ]
        found: dict[str, object] = {
            "pick": result.ranked[0].address if result.ranked else None,
            "decided_by": result.winner_by,
            "weights": {name: weight for name, weight, _ in parts},
            "candidates": candidates,
            "filtered": dropped,
        }
        if not matches:
            for candidate in candidates:
                del candidate["total"]
            candidates.sort(key=lambda candidate: str(candidate["endpoint"]))
            del found["decided_by"]
            found["withheld"] = sorted(hidden)
            return found
        index = self._service.prefix
        if index is not None and result.ranked:
            prompt = index.prompt_tokens(self._request)
            uncached = index.uncached_tokens(self._request, result.ranked[0])
            found["prefix"] = {"prompt_tokens": prompt, "matched_tokens": prompt - uncached}
        return found

    def _shared_knowledge(self) -> set[str]:
        """The names of the policy's plugins that read what all traffic taught the picker."""
        plugins = self._service.policy.epp.plugins
        return {spec.name for spec in plugins if spec.type in SHARED_KNOWLEDGE}

    def prefill(self) -> EndpointState | None:
        """The prefill endpoint, dispatched now (the prefill hop is about to be sent)."""
        if self._prefill is None:
            return None
        state, target = self._prefill
        self._prefill = None
        self._dispatches.append((state, self._service.dispatched(self._request, target)))
        return state

    def next(self, exclude: set[str]) -> EndpointState | None:
        ranked = self._ranked
        while self._cursor < len(ranked):
            state, target = ranked[self._cursor]
            self._cursor += 1
            if not exclude or state.address not in exclude:
                self._dispatches.append((state, self._service.dispatched(self._request, target)))
                return state
        return None

    def refused(self, endpoint: EndpointState) -> None:
        for state, dispatch in self._dispatches:
            if state is endpoint:
                self._service.refused(dispatch)

    def started(self, endpoint: EndpointState) -> None:
        for state, dispatch in self._dispatches:
            if state is endpoint:
                self._service.prefilled(dispatch)

    def finished(self, endpoint: EndpointState, prompt_tokens: int | None = None) -> None:
        for state, dispatch in self._dispatches:
            if state is endpoint:
                self._service.finished(dispatch, prompt_tokens)
