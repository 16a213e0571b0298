"""The EPP's KV-event subscriber against real backend processes, in both of vLLM's socket
layouts (the engine binds, or the engine connects to the EPP's bound socket), and with the
replay socket filling in what was published before the subscriber attached."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from epp.datalayer.indexes.precise import PreciseIndex, block_keys
from epp.datalayer.kv_events import KVEventSubscriber
from epp.framework import Endpoint, EndpointMetadata
from kvgate.wire.tokenizer import ByteTokenizer
from loadtest.harness.processes import free_port

BLOCK = 16
PROMPT = "a long shared system prompt for the parcel company, answer briefly. " * 3


async def complete(base: str, prompt: str) -> None:
    body = {"model": "kvgate-sim", "prompt": prompt, "max_tokens": 1}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{base}/v1/completions", json=body) as response,
    ):
        assert response.status == 200, await response.text()


def keys(prompt: str) -> list[int]:
    return block_keys(ByteTokenizer().encode(prompt), BLOCK)


async def known(index: PreciseIndex, prompt: str, address: str, seconds: float = 5.0) -> bool:
    """Whether ``index`` learns within ``seconds`` that ``address`` holds ``prompt``'s start."""
    for _ in range(int(seconds / 0.05)):
        if index.match(keys(prompt), [address])[address] > 0:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_engines_connect_to_one_socket_the_epp_binds(
    start_backend: Callable[..., str],
) -> None:
    bound = f"tcp://127.0.0.1:{free_port()}"
    urls = [
        start_backend("--kv-events-endpoint", bound, "--cost", "zero", "--block-size", "16")
        for _ in range(2)
    ]
    endpoints = [
        Endpoint(EndpointMetadata(u.removeprefix("http://"), "p", kv_events_bind=bound))
        for u in urls
    ]
    index = PreciseIndex()
    subscriber = KVEventSubscriber(index, endpoints)
    await subscriber.start()
    try:
        await asyncio.sleep(0.5)  # the engines' connections reach the bound socket
        for i, url in enumerate(urls):
            await complete(url, f"{i} {PROMPT}")
        addresses = [e.address for e in endpoints]
        # each engine's blocks are credited to it, told apart by the topic it publishes on
        for i, address in enumerate(addresses):
            prompt_keys = keys(f"{i} {PROMPT}")
            assert await known(index, f"{i} {PROMPT}", address)
            assert index.match(prompt_keys, addresses) == {
                a: len(prompt_keys) if a == address else 0 for a in addresses
            }
    finally:
        await subscriber.stop()


async def test_replay_fills_in_what_was_sent_before_the_subscriber_attached(
    start_backend: Callable[..., str],
) -> None:
    events, replay = free_port(), free_port()
    url = start_backend(
        "--kv-events-port",
        str(events),
        "--kv-events-replay-port",
        str(replay),
        "--cost",
        "zero",
        "--block-size",
        "16",
    )
    address = url.removeprefix("http://")
    await complete(url, PROMPT)  # published before anyone listens: lost on PUB/SUB
    for with_replay in (False, True):
        endpoint = Endpoint(
            EndpointMetadata(
                address,
                "p",
                kv_events_port=events,
                kv_events_replay_port=replay if with_replay else None,
            )
        )
        index = PreciseIndex()
        subscriber = KVEventSubscriber(index, [endpoint])
        await subscriber.start()
        try:
            await asyncio.sleep(0.5)  # ZMQ slow joiner
            if with_replay:  # the history comes at start, before any new batch is published
                assert await known(index, PROMPT, address)
            later = f"another prompt, sent once the subscriber listens {with_replay} " * 3
            await complete(url, later)
            assert await known(index, later, address)
            early = index.match(keys(PROMPT), [address])[address]
            assert early == (len(keys(PROMPT)) if with_replay else 0), (with_replay, early)
            assert (subscriber.replayed > 0) == with_replay
        finally:
            await subscriber.stop()


async def test_a_picker_started_next_to_a_warm_engine_knows_what_it_holds_by_default(
    start_backend: Callable[..., str],
) -> None:
    """Only the events port is configured on both sides: the backend serves replay on the next
    port, the picker asks there, and its start waits for the answer."""
    from epp.service import EppService
    from policies.loader import load_policy_text

    events = free_port()
    url = start_backend("--kv-events-port", str(events), "--cost", "zero", "--block-size", "16")
    address = url.removeprefix("http://")
    await complete(url, PROMPT)  # the engine is warm before any picker listens
    policy = load_policy_text(
        f"pools: {{p: {{endpoints: [{address}], kv_events: {{port: {events}}}}}}}\n"
        "routes: [{model: kvgate-sim, pool: p}]\n"
        "epp: {plugins: [{name: prefix, type: prefix-cache-scorer, params: {mode: precise}},"
        " {name: pick, type: max-score-picker}],"
        " profiles: [{name: default, plugins: [{ref: prefix}, {ref: pick}]}]}\n"
    )
    assert policy.pools["p"].kv_events_replay_port is None  # not configured: the default
    service = EppService(policy)
    await service.start()
    try:
        assert service.prefix is not None
        request = service.scheduling_request("p", "r", "kvgate-sim", {"prompt": PROMPT}, {})
        assert service.prefix.match(service.prefix.keys(request), [address])[address] > 0
    finally:
        await service.stop()
