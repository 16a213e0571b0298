"""Prefill and decode workers on the simulated runner: the kv_transfer_params protocol, the
held blocks' lease, and what happens when a hop fails. Every test ends with no block held."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from tests.backends.pd.servers import ServerFactory, Worker, prefill_body, start_worker

PROMPT = "The quick brown fox jumps over the lazy dog. " * 12  # 540 tokens, 34 blocks
BODY: dict[str, Any] = {"model": "kvgate-sim", "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
ZERO = ("--cost", "zero")


async def pd_generate(
    session: aiohttp.ClientSession, prefill: Worker, decode: Worker, body: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    status, first = await prefill.post(session, prefill_body(body))
    assert status == 200, first
    params = first["kv_transfer_params"]
    status, second = await decode.post(session, {**body, "kv_transfer_params": params})
    assert status == 200, second
    return first, second


async def wait_for(condition: Callable[[], bool], within: float = 3.0) -> None:
    """Poll ``condition`` (engine state has no event to wait on) until true or ``within``."""
    async with asyncio.timeout(within):
        for _ in itertools.count():
            if condition():
                return
            await asyncio.sleep(0.02)


async def test_pd_output_is_the_monolithic_servers(aiohttp_server: ServerFactory) -> None:
    prefill = await start_worker(aiohttp_server, "--role", "prefill", *ZERO)
    decode = await start_worker(aiohttp_server, "--role", "decode", *ZERO)
    whole = await start_worker(aiohttp_server, *ZERO)
    async with aiohttp.ClientSession() as session:
        first, second = await pd_generate(session, prefill, decode, BODY)
        _, alone = await whole.post(session, BODY)
        params = first["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert params["remote_host"] == "127.0.0.1" and params["remote_port"] > 0
        assert len(params["remote_block_ids"]) == 34 and params["remote_engine_id"]
        assert second["choices"][0]["text"] == alone["choices"][0]["text"]
        assert second["usage"]["completion_tokens"] == 12
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 539  # all but one
        assert "kv_transfer_params" not in alone
        assert await decode.metric(session, "kvgate:kv_transfer_blocks_total") == 34
        assert await prefill.metric(session, "kvgate:kv_transfer_bytes_total") == 34 * 16 * 32768
        assert await prefill.metric(session, "kvgate:kv_blocks_held") == 0
    assert prefill.blocks_in_use == 0 and decode.blocks_in_use == 0


async def test_a_chat_request_goes_through_pd_unchanged(aiohttp_server: ServerFactory) -> None:
    prefill = await start_worker(aiohttp_server, "--role", "prefill", *ZERO)
    decode = await start_worker(aiohttp_server, "--role", "decode", *ZERO)
    whole = await start_worker(aiohttp_server, *ZERO)
    chat = {
        "model": "kvgate-sim",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 8,
        "temperature": 0,
    }
    path = "/v1/chat/completions"
    async with aiohttp.ClientSession() as session:
        _, first = await prefill.post(session, prefill_body(chat), path)
        _, second = await decode.post(
            session, {**chat, "kv_transfer_params": first["kv_transfer_params"]}, path
        )
        _, alone = await whole.post(session, chat, path)
    assert second["choices"][0]["message"] == alone["choices"][0]["message"]


async def test_blocks_the_decode_worker_caches_are_not_transferred(
    aiohttp_server: ServerFactory,
) -> None:
    prefill = await start_worker(aiohttp_server, "--role", "prefill", *ZERO)
    decode = await start_worker(aiohttp_server, "--role", "decode", *ZERO)
    async with aiohttp.ClientSession() as session:
        await pd_generate(session, prefill, decode, BODY)
        longer = {**BODY, "prompt": PROMPT + "And then it ran away into the woods."}
        _, again = await pd_generate(session, prefill, decode, longer)
        # the first 33 blocks (528 tokens) were cached from the first request; 3 more moved
        assert await decode.metric(session, "kvgate:kv_transfer_blocks_total") == 34 + 3
        assert (
            again["usage"]["prompt_tokens_details"]["cached_tokens"]
            == again["usage"]["prompt_tokens"] - 1
        )
        await wait_for(lambda: prefill.blocks_in_use == 0)
    assert decode.blocks_in_use == 0


async def test_blocks_nobody_pulls_are_freed_when_the_lease_lapses(
    aiohttp_server: ServerFactory,
) -> None:
    prefill = await start_worker(
        aiohttp_server, "--role", "prefill", "--kv-lease-seconds", "0.2", *ZERO
    )
    async with aiohttp.ClientSession() as session:
        status, _ = await prefill.post(session, prefill_body(BODY))
        assert status == 200
        assert prefill.blocks_in_use == 34
        assert await prefill.metric(session, "kvgate:kv_blocks_held") == 34
        await wait_for(lambda: prefill.blocks_in_use == 0)
        assert await prefill.metric(session, "kvgate:kv_lease_expiries_total") == 1


async def test_heartbeats_keep_a_queued_requests_blocks(aiohttp_server: ServerFactory) -> None:
    """The decode worker is busy for longer than the lease; its heartbeats keep the blocks."""
    prefill = await start_worker(
        aiohttp_server, "--role", "prefill", "--kv-lease-seconds", "0.3", *ZERO
    )
    decode = await start_worker(
        aiohttp_server,
        "--role",
        "decode",
        "--kv-lease-seconds",
        "0.3",
        "--max-num-seqs",
        "1",
        "--cost",
        "0.01,0,0,0",
    )
    whole = await start_worker(aiohttp_server, *ZERO)
    async with aiohttp.ClientSession() as session:
        busy = asyncio.create_task(
            decode.post(session, {**BODY, "prompt": "busy", "max_tokens": 80, "ignore_eos": True})
        )
        await wait_for(lambda: decode.state.engine.scheduler.num_running == 1)
        _, second = await pd_generate(session, prefill, decode, BODY)  # waited ~0.8 s in queue
        _, alone = await whole.post(session, BODY)
        await busy
        assert second["choices"][0]["text"] == alone["choices"][0]["text"]
        assert await prefill.metric(session, "kvgate:kv_lease_expiries_total") == 0
        assert await decode.metric(session, "kvgate:kv_transfer_failures_total") == 0
    assert prefill.blocks_in_use == 0 and decode.blocks_in_use == 0


async def test_a_cancelled_decode_frees_the_prefill_workers_blocks_at_once(
    aiohttp_server: ServerFactory,
) -> None:
    prefill = await start_worker(aiohttp_server, "--role", "prefill", *ZERO)  # 10 s lease
    decode = await start_worker(
        aiohttp_server, "--role", "decode", "--max-num-seqs", "1", "--cost", "0.01,0,0,0"
    )
    async with aiohttp.ClientSession() as session:
        busy = asyncio.create_task(
            decode.post(session, {**BODY, "prompt": "busy", "max_tokens": 60, "ignore_eos": True})
        )
        await wait_for(lambda: decode.state.engine.scheduler.num_running == 1)
        _, first = await prefill.post(session, prefill_body(BODY))
        queued = asyncio.create_task(
            decode.post(session, {**BODY, "kv_transfer_params": first["kv_transfer_params"]})
        )
        await wait_for(lambda: decode.state.engine.scheduler.num_waiting == 1)
        queued.cancel()  # the client goes away while its request waits
        await wait_for(lambda: prefill.blocks_in_use == 0, within=2.0)
        await busy
        assert await prefill.metric(session, "kvgate:kv_lease_expiries_total") == 0
    await wait_for(lambda: decode.blocks_in_use == 0)


async def test_an_unreachable_prefill_worker_means_a_local_prefill(
    aiohttp_server: ServerFactory,
) -> None:
    prefill = await start_worker(aiohttp_server, "--role", "prefill", *ZERO)
    decode = await start_worker(aiohttp_server, "--role", "decode", *ZERO)
    whole = await start_worker(aiohttp_server, *ZERO)
    async with aiohttp.ClientSession() as session:
        _, first = await prefill.post(session, prefill_body(BODY))
        params = first["kv_transfer_params"]
        for broken in (
            {**params, "remote_port": 1},  # nobody listens
            {**params, "remote_request_id": "never-held"},  # not held there
            {**params, "remote_engine_id": "a-restarted-engine"},
        ):
            status, reply = await decode.post(session, {**BODY, "kv_transfer_params": broken})
            assert status == 200, reply
            _, alone = await whole.post(session, BODY)
            assert reply["choices"][0]["text"] == alone["choices"][0]["text"]
        assert await decode.metric(session, "kvgate:kv_transfer_failures_total") == 3
        assert prefill.blocks_in_use == 34  # none of them named the held request
        status, reply = await decode.post(session, {**BODY, "kv_transfer_params": params})
        assert status == 200 and prefill.blocks_in_use == 0
    assert decode.blocks_in_use == 0


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ("yes", "kv_transfer_params"),
        ({"do_remote_decode": "true"}, "kv_transfer_params.do_remote_decode"),
        ({"do_remote_prefill": True, "remote_port": 5600}, "kv_transfer_params.remote_host"),
        (
            {
                "do_remote_prefill": True,
                "remote_host": "h",
                "remote_port": 70000,
                "remote_request_id": "r",
            },
            "kv_transfer_params.remote_port",
        ),
        ({"remote_block_ids": [1, -2]}, "kv_transfer_params.remote_block_ids"),
        (
            {"do_remote_decode": True, "do_remote_prefill": True},
            "kv_transfer_params.do_remote_prefill",
        ),
    ],
)
async def test_malformed_kv_transfer_params_are_a_400_naming_the_field(
    aiohttp_server: ServerFactory, params: object, param: str
) -> None:
    decode = await start_worker(aiohttp_server, "--role", "decode", *ZERO)
    async with aiohttp.ClientSession() as session:
        status, reply = await decode.post(session, {**BODY, "kv_transfer_params": params})
    assert status == 400 and reply["error"]["param"] == param, reply


async def test_a_streamed_prefill_for_a_remote_decode_is_refused(
    aiohttp_server: ServerFactory,
) -> None:
    prefill = await start_worker(aiohttp_server, "--role", "prefill", *ZERO)
    async with aiohttp.ClientSession() as session:
        status, reply = await prefill.post(session, {**prefill_body(BODY), "stream": True})
    assert status == 400 and "must not stream" in reply["error"]["message"]
    assert prefill.blocks_in_use == 0


async def test_a_monolithic_server_ignores_kv_transfer_params(
    aiohttp_server: ServerFactory,
) -> None:
    whole = await start_worker(aiohttp_server, *ZERO)
    async with aiohttp.ClientSession() as session:
        status, reply = await whole.post(session, prefill_body(BODY))
    assert status == 200 and "kv_transfer_params" not in reply
    assert whole.blocks_in_use == 0


async def test_a_prefiller_header_makes_the_decode_worker_run_the_prefill_hop(
    aiohttp_server: ServerFactory,
) -> None:
    """llm-d's flow: the request names one destination (the decode worker) and its prefiller."""
    prefill = await start_worker(aiohttp_server, "--role", "prefill", *ZERO)
    decode = await start_worker(aiohttp_server, "--role", "decode", *ZERO)
    whole = await start_worker(aiohttp_server, *ZERO)
    prefiller = prefill.url.removeprefix("http://")
    async with aiohttp.ClientSession() as session:
        _, alone = await whole.post(session, BODY)
        for header in ("x-prefiller-host-port", "x-llm-d-prefiller-host-port"):
            async with session.post(
                decode.url + "/v1/completions", json=BODY, headers={header: prefiller}
            ) as response:
                reply = await response.json()
            assert reply["choices"][0]["text"] == alone["choices"][0]["text"]
        assert await decode.metric(session, "kvgate:kv_transfer_blocks_total") == 34 + 1
        assert await decode.metric(session, "kvgate:prefill_hops_total") == 2
        # a dead prefiller first, then a live one: the second is used
        dead = f"127.0.0.1:1,{prefiller}"
        async with session.post(
            decode.url + "/v1/completions",
            json={**BODY, "stream": True},
            headers={"x-prefiller-host-port": dead},
        ) as response:
            streamed = await response.text()
        assert streamed.rstrip().endswith("data: [DONE]")
        await wait_for(lambda: prefill.blocks_in_use == 0)
    assert decode.blocks_in_use == 0


async def test_without_a_live_prefiller_the_decode_worker_prefills_locally(
    aiohttp_server: ServerFactory,
) -> None:
    decode = await start_worker(aiohttp_server, "--role", "decode", *ZERO)
    whole = await start_worker(aiohttp_server, *ZERO)
    monolithic = whole.url.removeprefix("http://")  # answers, but holds no KV for anyone
    async with aiohttp.ClientSession() as session:
        _, alone = await whole.post(session, BODY)
        for prefiller in ("127.0.0.1:1", monolithic):
            async with session.post(
                decode.url + "/v1/completions",
                json=BODY,
                headers={"x-prefiller-host-port": prefiller},
            ) as response:
                assert response.status == 200
                reply = await response.json()
            assert reply["choices"][0]["text"] == alone["choices"][0]["text"]
        for outcome in ("error", "no_params"):
            name = f'kvgate:prefill_hops_total{{outcome="{outcome}"}}'
            assert await decode.metric(session, name) == 1
        assert await decode.metric(session, "kvgate:kv_transfer_blocks_total") == 0
    assert whole.blocks_in_use == 0 and decode.blocks_in_use == 0
