"""``/v1/responses`` through the gateway with the official ``openai`` client (OpenAI
paths): created whole and streamed; retrieved, listed, continued and deleted by id on the
backend that stored it, whichever of two it is; hidden from another tenant; found by a gateway
that never relayed it; a stream cut before its terminal event ends with an error event."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import aiohttp
import openai
import pytest

from loadtest.harness.processes import KvgateProcess
from tests.fakes import close_after_test
from tests.http_servers import started
from tests.integration.metrics_util import scrape

KEYS = {"acme": "sk-responses-acme", "beta": "sk-responses-beta"}


def policy(endpoints: list[str], idle: str = "10s") -> str:
    keys = ", ".join(
        f"{{sha256: {hashlib.sha256(key.encode()).hexdigest()}, tenant: {tenant}}}"
        for tenant, key in KEYS.items()
    )
    return f"""
pools: {{p: {{endpoints: [{", ".join(endpoints)}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
auth: {{api_keys: [{keys}]}}
timeouts: {{connect: 1s, first_byte: 10s, idle: {idle}}}
"""


def client(url: str, tenant: str = "acme") -> openai.OpenAI:
    return close_after_test(
        openai.OpenAI(base_url=f"{url}/v1", api_key=KEYS[tenant], max_retries=0)
    )


def test_responses_are_created_and_reached_by_id_on_the_backend_holding_them(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backends = [start_backend("--cost", "zero").removeprefix("http://") for _ in range(2)]
    url, _ = start_gateway(policy(backends))
    acme = client(url)
    made = [
        acme.responses.create(
            model="kvgate-sim",
            instructions="Answer briefly.",
            input=f"question {number}: what is in the box?",
            max_output_tokens=6,
        )
        for number in range(8)
    ]
    for response in made:
        assert response.output_text and response.usage is not None
        assert response.usage.input_tokens > 0 and response.usage.output_tokens == 6
    # both backends hold some: reaching each by id needs the gateway to know where it lives
    assert len({r.id for r in made}) == 8
    for response in made:
        assert acme.responses.retrieve(response.id).output_text == response.output_text
        items = acme.responses.input_items.list(response.id).data
        assert [item.role for item in items] == ["user"]  # type: ignore[union-attr]
        more = acme.responses.create(
            model="kvgate-sim",
            input="and then?",
            previous_response_id=response.id,
            max_output_tokens=2,
        )  # the backend that stored the first turn continues it; the other has never seen it
        assert more.usage is not None and more.usage.input_tokens > response.usage.input_tokens  # type: ignore[union-attr]

    with pytest.raises(openai.NotFoundError):
        client(url, "beta").responses.retrieve(made[0].id)  # acme's, not beta's
    with pytest.raises(openai.NotFoundError):
        client(url, "beta").responses.create(
            model="kvgate-sim", input="x", previous_response_id=made[0].id
        )
    with pytest.raises(openai.NotFoundError):
        acme.responses.retrieve("resp_nobody_has_this")

    # a gateway that never relayed them (a restart, another replica) asks the backends
    fresh, _ = start_gateway(policy(backends))
    for response in made[:4]:
        assert client(fresh).responses.retrieve(response.id).id == response.id

    acme.responses.delete(made[0].id)
    with pytest.raises(openai.NotFoundError):
        acme.responses.retrieve(made[0].id)

    stream = acme.responses.create(
        model="kvgate-sim", input="stream it", max_output_tokens=5, stream=True
    )
    events = list(stream)
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    last = events[-1]
    assert last.type == "response.incomplete"
    assert text == last.response.output_text
    streamed_id = last.response.id
    assert acme.responses.retrieve(streamed_id).output_text == text

    requests = scrape(url)["kvgate_requests_total"]
    routes = {s.labels["route"] for s in requests}
    assert {"/v1/responses", "/v1/responses/{id}", "/v1/responses/{id}/input_items"} <= routes
    assert not any("resp_" in route for route in routes)  # ids are not labels
    tokens = scrape(url)["kvgate_tokens_total"]
    prompt = sum(s.value for s in tokens if s.labels.get("direction") == "prompt")
    assert prompt > 0  # the responses' usage (input_tokens) was metered


async def test_a_response_stream_cut_before_its_end_gets_an_error_event(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    created = {"type": "response.created", "response": {"id": "resp_cut", "status": "x"}}
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    first = f"event: response.created\ndata: {json.dumps(created)}\n\n".encode()
    chunk = b"%x\r\n%b\r\n" % (len(first), first)
    upstream, server = await started(lambda _: head + chunk)  # and then nothing more
    async with server:
        url, _ = start_gateway(policy([f"127.0.0.1:{upstream.port}"], idle="1s"))
        body = {"model": "kvgate-sim", "input": "hi", "stream": True}
        headers = {"Authorization": f"Bearer {KEYS['acme']}"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/v1/responses", json=body, headers=headers) as response,
        ):
            assert response.status == 200
            text = (await response.read()).decode()
    events = [e for e in text.split("\n\n") if e]
    assert events[0].startswith("event: response.created")
    name, data = events[-1].split("\n")
    assert name == "event: error"
    assert json.loads(data.removeprefix("data: "))["code"] == "upstream_stream_broken"


def test_the_backend_refuses_what_it_cannot_answer(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    url, _ = start_gateway(policy([start_backend("--cost", "zero").removeprefix("http://")]))
    acme = client(url)
    with pytest.raises(openai.BadRequestError, match="input"):
        acme.responses.create(model="kvgate-sim", input=5)  # type: ignore[call-overload]
    with pytest.raises(openai.BadRequestError, match="background"):
        acme.responses.create(model="kvgate-sim", input="x", background=True)
    with pytest.raises(openai.NotFoundError):
        acme.responses.create(model="kvgate-sim", input="x", previous_response_id="resp_gone")
    with pytest.raises(openai.BadRequestError, match="max_output_tokens"):
        acme.responses.create(model="kvgate-sim", input="x", max_output_tokens=0)
    made = acme.responses.create(model="kvgate-sim", input="x", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        acme.responses.retrieve(made.id)  # not stored
