"""The endpoint picker embedded in the gateway: the gateway's ``Picker`` contract, backed by
an in-process ``EppService``."""

from __future__ import annotations

from epp.service import EppService
from gateway.picker import EndpointState, PickRequest
from policies.schema import Policy


class EmbeddedEpp:
    def __init__(
        self,
        policy: Policy,
        states: dict[str, list[EndpointState]],
        service: EppService | None = None,
    ) -> None:
        self.service = service or EppService(policy)
        self._states = {(s.pool, s.address): s for pool in states.values() for s in pool}

    async def start(self) -> None:
        await self.service.start()

    async def stop(self) -> None:
        await self.service.stop()

    def pick(self, pool: str, request: PickRequest, exclude: set[str]) -> EndpointState | None:
        model = self.service.target_model(pool, request.model)
        scheduling = self.service.scheduling_request(
            pool, request.request_id, model, request.body, request.headers
        )
        target = self.service.pick(pool, scheduling, exclude=exclude).target
        return None if target is None else self._states[(pool, target.address)]
