"""The Pick API counts a pick in flight at its endpoint until the caller reports it finished,
a retry ends the try before it, and an unreported pick is let go after a while (in process:
the servicer called as gRPC would)."""

from __future__ import annotations

import asyncio

from epp.servers.pick_api import PickApi
from epp.service import EppService
from kvgate.api import epp_pb2
from policies.loader import load_policy_text

POLICY = "pools: {p: {endpoints: [127.0.0.2:9, 127.0.0.3:9]}}\nroutes: [{model: m, pool: p}]\n"


def in_flight(service: EppService) -> int:
    return sum(e.in_flight for e in service.datastore.endpoints("p"))


def decode_tokens(service: EppService) -> int:
    return sum(e.load.decode_tokens for e in service.datastore.endpoints("p"))


async def pick(api: PickApi, text: str, request_id: str = "") -> epp_pb2.PickResponse:
    request = epp_pb2.PickRequest(model="m", routing_text=text, request_id=request_id)
    return await api.Pick(request, None)


async def finished(api: PickApi, request_id: str, refused: bool = False) -> bool:
    request = epp_pb2.FinishedRequest(request_id=request_id, prompt_tokens=12, refused=refused)
    reply = await api.Finished(request, None)
    return reply.known


async def test_a_pick_is_in_flight_until_the_caller_reports_it_finished() -> None:
    service = EppService(load_policy_text(POLICY))
    api = PickApi(service)
    first = await pick(api, "hello " * 40, "r-1")
    second = await pick(api, "other " * 40)  # no id: the picker gives it one
    assert first.request_id == "r-1" and second.request_id
    assert in_flight(service) == 2 and decode_tokens(service) > 0
    assert await finished(api, "r-1")
    assert in_flight(service) == 1
    assert await finished(api, second.request_id, refused=True)
    assert in_flight(service) == 0 and decode_tokens(service) == 0
    # over (one refused) before any scrape: neither counts toward the saturation queue
    assert sum(e.load.dispatched for e in service.datastore.endpoints("p")) == 0
    assert not await finished(api, "r-1")  # once only


async def test_a_retry_ends_the_try_before_it() -> None:
    service = EppService(load_policy_text(POLICY))
    api = PickApi(service)
    first = await pick(api, "hello " * 40, "r-1")
    retry = epp_pb2.PickRequest(
        model="m", routing_text="hello " * 40, request_id="r-1", exclude=[first.pd.decode]
    )
    again = await api.Pick(retry, None)
    assert again.pd.decode != first.pd.decode
    assert in_flight(service) == 1


async def test_an_unreported_pick_is_let_go_after_a_while() -> None:
    service = EppService(load_policy_text(POLICY + "epp: {pick_open_timeout: 50ms}\n"))
    api = PickApi(service)
    for n in range(20):  # a caller that never reports: the counts must not grow for good
        await pick(api, f"prompt {n} " * 20, f"r-{n}")
    assert in_flight(service) == 20
    await asyncio.sleep(0.1)
    await pick(api, "one more " * 20, "r-last")
    assert in_flight(service) == 1 and decode_tokens(service) > 0
