"""Prefill/decode disaggregation end to end: the gateway with its embedded endpoint picker in
front of two prefill and two decode workers (real subprocesses on loopback), driven by the
official ``openai`` client, with every failure case of the PD issue."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest

from bench.envoy_messages import body_messages, headers_message
from kvgate.api.envoy import external_processor_pb2_grpc as ep_grpc
from loadtest.harness.processes import KvgateProcess, backend_process, epp_process, free_port
from tests.fakes import close_after_test
from tests.integration.metrics_util import scrape

Gateway = Callable[..., tuple[str, KvgateProcess]]
LONG = "Summarise the incident report of parcel route {n}: the van left the depot late. " * 10


class Workers:
    def __init__(self, stack: ExitStack) -> None:
        self.stack = stack
        self.processes: dict[str, KvgateProcess] = {}

    def start(self, role: str, *extra: str) -> str:
        port = free_port()
        args = ("--role", role, *extra) if role != "both" else extra
        process = self.stack.enter_context(backend_process(port, *args))
        address = f"127.0.0.1:{port}"
        self.processes[address] = process
        return address


@pytest.fixture
def workers() -> Iterator[Workers]:
    with ExitStack() as stack:
        yield Workers(stack)


def pd_policy(prefill: list[str], decode: list[str], extra: str = "") -> str:
    endpoints = [f"{{address: {a}, role: prefill}}" for a in prefill]
    endpoints += [f"{{address: {a}, role: decode}}" for a in decode]
    key = hashlib.sha256(b"pd-test-key").hexdigest()
    return f"""
auth: {{api_keys: [{{sha256: {key}, tenant: t}}]}}
pools: {{pd: {{pd: {{min_uncached_tokens: 64}}, endpoints: [{", ".join(endpoints)}]}}}}
routes: [{{model: kvgate-sim, pool: pd}}]
observability: {{access_log: "off"}}
{extra}
"""


def total(address: str, name: str, **labels: str) -> float:
    samples = scrape(f"http://{address}").get(name, [])
    return sum(s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items()))


def client(url: str) -> openai.OpenAI:
    """A client of the gateway (its key) or of a worker (which ignores it)."""
    return close_after_test(
        openai.OpenAI(base_url=f"{url}/v1", api_key="pd-test-key", max_retries=0, timeout=30)
    )


def wait_until(condition: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_the_gateway_runs_both_hops_and_the_output_is_the_monolithic_servers(
    workers: Workers, start_gateway: Gateway
) -> None:
    prefill = [workers.start("prefill", "--cost", "zero") for _ in range(2)]
    decode = [workers.start("decode", "--cost", "zero") for _ in range(2)]
    whole = workers.start("both", "--cost", "zero")
    url, _ = start_gateway(pd_policy(prefill, decode))
    time.sleep(0.5)  # the picker's first scrapes (stale metrics count as saturated)
    api, reference = client(url), client(f"http://{whole}")
    for n in range(4):
        kwargs: dict[str, Any] = {
            "model": "kvgate-sim",
            "prompt": LONG.format(n=n),
            "max_tokens": 10,
            "temperature": 0,
        }
        got, expected = api.completions.create(**kwargs), reference.completions.create(**kwargs)
        assert got.choices[0].text == expected.choices[0].text
    chat = {"model": "kvgate-sim", "messages": [{"role": "user", "content": LONG.format(n=9)}],
            "max_tokens": 12, "temperature": 0}  # fmt: skip
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in api.chat.completions.create(stream=True, **chat)  # type: ignore[call-overload]
        if c.choices
    )
    assert streamed == reference.chat.completions.create(**chat).choices[0].message.content  # type: ignore[call-overload]
    assert total(url.removeprefix("http://"), "kvgate_prefill_hops_total", outcome="ok") == 5
    assert sum(total(a, "kvgate:kv_transfer_blocks_total") for a in decode) >= 5 * 40
    assert all(total(a, "kvgate:kv_blocks_held") == 0 for a in prefill)
    # a short prompt is prefilled where it is decoded: no hop
    api.completions.create(model="kvgate-sim", prompt="hi", max_tokens=2)
    assert total(url.removeprefix("http://"), "kvgate_prefill_hops_total") == 5


def test_client_supplied_kv_params_and_prefiller_headers_are_dropped(
    workers: Workers, start_gateway: Gateway
) -> None:
    prefill = workers.start("prefill", "--cost", "zero")
    decode = workers.start("decode", "--cost", "zero")
    url, _ = start_gateway(pd_policy([prefill], [decode]))
    time.sleep(0.5)
    spoofed = {"do_remote_prefill": True, "remote_host": "10.255.255.1", "remote_port": 9,
               "remote_request_id": "x"}  # fmt: skip
    client(url).completions.create(
        model="kvgate-sim",
        prompt="short",
        max_tokens=2,
        extra_body={"kv_transfer_params": spoofed},
        extra_headers={"x-prefiller-host-port": prefill, "x-llm-d-prefiller-host-port": prefill},
    )
    assert total(decode, "kvgate:kv_transfer_failures_total") == 0  # it pulled from nowhere
    assert total(decode, "kvgate:prefill_hops_total") == 0  # it ran no hop of its own
    assert total(prefill, "vllm:request_success_total") == 0


def test_dead_prefill_workers_mean_local_prefill_not_failure(
    workers: Workers, start_gateway: Gateway
) -> None:
    prefill = [workers.start("prefill", "--cost", "zero") for _ in range(2)]
    decode = workers.start("decode", "--cost", "zero")
    whole = workers.start("both", "--cost", "zero")
    url, _ = start_gateway(pd_policy(prefill, [decode]))
    time.sleep(0.5)
    for address in prefill:
        workers.processes[address].kill()
    kwargs: dict[str, Any] = {
        "model": "kvgate-sim",
        "prompt": LONG.format(n=1),
        "max_tokens": 6,
        "temperature": 0,
    }
    for _ in range(3):  # first while the picker's metrics are fresh, then once they are stale
        got = client(url).completions.create(**kwargs)
        assert (
            got.choices[0].text
            == client(f"http://{whole}").completions.create(**kwargs).choices[0].text
        )
        time.sleep(0.3)
        kwargs["prompt"] = str(kwargs["prompt"]) + " more"
    assert total(url.removeprefix("http://"), "kvgate_prefill_hops_total", outcome="ok") == 0


def test_a_decode_worker_dying_mid_stream_ends_the_stream_with_an_error(
    workers: Workers, start_gateway: Gateway
) -> None:
    prefill = workers.start("prefill", "--cost", "zero")
    decode = workers.start("decode", "--cost", "0.02,0,0,0")
    url, _ = start_gateway(pd_policy([prefill], [decode]))
    time.sleep(0.5)
    stream = client(url).completions.create(
        model="kvgate-sim", prompt=LONG.format(n=3), max_tokens=200, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    with pytest.raises(openai.APIError):
        for number, _ in enumerate(stream):
            if number == 5:
                workers.processes[decode].kill()
    assert total(prefill, "kvgate:kv_blocks_held") == 0  # pulled before decoding began


async def test_a_client_leaving_during_the_prefill_hop_cancels_it(
    workers: Workers, start_gateway: Gateway
) -> None:
    prefill = workers.start("prefill", "--cost", "1.0,0,0,0")  # each step takes a second
    decode = workers.start("decode", "--cost", "zero")
    url, _ = start_gateway(pd_policy([prefill], [decode]))
    await asyncio.sleep(0.5)
    api = openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="pd-test-key", max_retries=0, timeout=0.3
    )
    with pytest.raises(openai.APITimeoutError):
        await api.completions.create(model="kvgate-sim", prompt=LONG.format(n=4), max_tokens=4)
    wait_until(lambda: total(prefill, "vllm:request_success_total", finished_reason="abort") == 1)
    assert total(prefill, "kvgate:kv_blocks_held") == 0
    assert total(decode, "vllm:request_success_total") == 0  # the decode hop never started


def test_behind_envoy_the_picker_names_the_decode_worker_and_its_prefiller(
    workers: Workers, tmp_path: Path
) -> None:
    """ext_proc, as Envoy drives it: the picker's reply names one destination (a decode
    worker) and the prefiller header; the decode worker runs the prefill hop itself."""
    prefill = workers.start("prefill", "--cost", "zero")
    decode = workers.start("decode", "--cost", "zero")
    whole = workers.start("both", "--cost", "zero")
    policy = tmp_path / "policy.yaml"
    policy.write_text(pd_policy([prefill], [decode]))
    grpc_port, metrics_port = free_port(), free_port()
    body: dict[str, Any] = {
        "model": "kvgate-sim",
        "prompt": LONG.format(n=5),
        "max_tokens": 8,
        "temperature": 0,
    }
    raw = json.dumps(body).encode()
    headers = {":path": "/v1/completions", ":method": "POST", "content-type": "application/json",
               "x-prefiller-host-port": "6.6.6.6:1"}  # a client's: never passed on  # fmt: skip
    with epp_process(str(policy), grpc_port, metrics_port):
        time.sleep(0.5)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = ep_grpc.ExternalProcessorStub(channel)  # type: ignore[no-untyped-call]
            replies = list(
                stub.Process(iter([headers_message(headers), *body_messages(raw)]), timeout=10)
            )
    mutation = replies[0].request_headers.response.header_mutation
    routed = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
    assert routed["x-gateway-destination-endpoint"] == decode
    assert routed["x-prefiller-host-port"] == prefill == routed["x-llm-d-prefiller-host-port"]
    assert "x-prefiller-host-port" not in mutation.remove_headers
    # Envoy sends the request where the picker said, with the headers it set
    forwarded = {k: routed[k] for k in ("x-prefiller-host-port", "x-llm-d-prefiller-host-port")}
    got = client(f"http://{decode}").completions.create(**body, extra_headers=forwarded)
    expected = client(f"http://{whole}").completions.create(**body)
    assert got.choices[0].text == expected.choices[0].text
    assert total(decode, "kvgate:prefill_hops_total", outcome="ok") == 1
    assert total(decode, "kvgate:kv_transfer_blocks_total") > 0
    assert total(prefill, "kvgate:kv_blocks_held") == 0
