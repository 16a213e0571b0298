"""kvgate's Pick API (``proto/epp.proto``), for gateways that run the picker as a service.

A pick counts as in flight at its endpoint (the load the active-request scorer and the
load-balance filter read) until the caller reports it ``Finished``; one never reported is let
go after the policy's ``epp.pick_open_timeout`` (5 minutes by default), so a caller that does
not report cannot leave the counts growing for good. A second Pick with the id of an open one
(a retry elsewhere) ends the first.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict

import grpc

from epp.service import Dispatch, EppService
from kvgate.api import epp_pb2, epp_pb2_grpc

MAX_OPEN_PICKS = 100_000  # past this many, the oldest are let go first


class PickApi(epp_pb2_grpc.EndpointPickerServicer):
    """kvgate's ``EndpointPicker`` gRPC service (``Pick``, ``Finished``) over an
    ``EppService``."""

    def __init__(self, service: EppService) -> None:
        self.service = service
        # how long an unreported pick counts as in flight
        self.open_seconds = service.policy.epp.pick_open_timeout
        # by request id, oldest first: when each was picked and what it dispatched
        self._open: OrderedDict[str, tuple[float, list[Dispatch]]] = OrderedDict()

    async def Finished(
        self, request: epp_pb2.FinishedRequest, context: grpc.aio.ServicerContext
    ) -> epp_pb2.FinishedResponse:
        self._expire(time.monotonic())
        entry = self._open.pop(request.request_id, None)
        if entry is None:
            return epp_pb2.FinishedResponse(known=False)
        if request.refused:
            for dispatch in entry[1]:
                self.service.refused(dispatch)
        else:
            self._finish(entry[1], request.prompt_tokens or None)
        return epp_pb2.FinishedResponse(known=True)

    def _finish(self, dispatches: list[Dispatch], prompt_tokens: int | None = None) -> None:
        for dispatch in dispatches:
            self.service.finished(dispatch, prompt_tokens)

    def _expire(self, now: float) -> None:
        """Let go of the picks past ``open_seconds`` (and the oldest, past ``MAX_OPEN_PICKS``)."""
        oldest = now - self.open_seconds
        while self._open:
            request_id, (picked_at, dispatches) = next(iter(self._open.items()))
            if picked_at > oldest and len(self._open) <= MAX_OPEN_PICKS:
                return
            del self._open[request_id]
            self._finish(dispatches)

    def _opened(self, request_id: str, dispatches: list[Dispatch]) -> None:
        now = time.monotonic()
        earlier = self._open.pop(request_id, None)
        if earlier is not None:  # a retry: the earlier try is over
            self._finish(earlier[1])
        self._open[request_id] = (now, dispatches)
        self._expire(now)

    async def Pick(
        self, request: epp_pb2.PickRequest, context: grpc.aio.ServicerContext
    ) -> epp_pb2.PickResponse:
        pool = self.service.pool_for_model(request.model)
        if pool is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {request.model!r}")
        assert pool is not None
        target = self.service.target_model(pool, request.model)
        prompt: object = request.routing_text
        if request.WhichOneof("prompt") == "token_ids":
            prompt = list(request.token_ids.ids)
        request_id = request.request_id or str(uuid.uuid4())
        scheduling = self.service.scheduling_request(
            pool,
            request_id,
            target,
            {"prompt": prompt},
            dict(request.headers),
        )
        subset = {s.rsplit(":", 1)[0] for s in request.subset} if request.subset else None
        decision = self.service.pick(pool, scheduling, exclude=set(request.exclude), subset=subset)
        result, prefill = decision.result, decision.prefill
        # the caller sends it on: dispatched now, in flight until Finished
        dispatches = [self.service.dispatched(scheduling, chosen) for chosen in decision.chosen]
        if dispatches:
            self._opened(request_id, dispatches)
        if result.target is None:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "no endpoint can serve the request"
            )
        endpoints = [
            epp_pb2.EndpointScore(
                address=e.address, score=result.scores[e.address], role=e.spec.role
            )
            for e in result.ranked
        ]
        return epp_pb2.PickResponse(
            endpoints=endpoints,
            target_model=target,
            decided_by=result.winner_by,
            pd=epp_pb2.PdPair(
                decode=result.ranked[0].address, prefill=prefill.address if prefill else ""
            ),
            request_id=request_id,
        )
