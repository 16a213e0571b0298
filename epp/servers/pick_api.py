"""kvgate's Pick API (``proto/epp.proto``), for gateways that run the picker as a service."""

from __future__ import annotations

import uuid

import grpc

from epp.service import EppService
from kvgate.api import epp_pb2, epp_pb2_grpc


class PickApi(epp_pb2_grpc.EndpointPickerServicer):
    """kvgate's ``EndpointPicker/Pick`` gRPC service over an ``EppService``."""

    def __init__(self, service: EppService) -> None:
        self.service = service

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
        scheduling = self.service.scheduling_request(
            pool,
            request.request_id or str(uuid.uuid4()),
            target,
            {"prompt": prompt},
            dict(request.headers),
        )
        subset = {s.rsplit(":", 1)[0] for s in request.subset} if request.subset else None
        decision = self.service.pick(pool, scheduling, exclude=set(request.exclude), subset=subset)
        result, prefill = decision.result, decision.prefill
        for chosen in decision.chosen:  # the caller sends it on: dispatched now
            self.service.dispatched(scheduling, chosen)
        if result.target is None:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "no endpoint can serve the request"
            )
        endpoints = [
            epp_pb2.EndpointScore(address=e.address, score=result.scores[e.address], role=e.role)
            for e in result.ranked
        ]
        return epp_pb2.PickResponse(
            endpoints=endpoints,
            target_model=target,
            decided_by=result.winner_by,
            pd=epp_pb2.PdPair(
                decode=result.ranked[0].address, prefill=prefill.address if prefill else ""
            ),
        )
