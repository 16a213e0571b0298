"""Gateway → in-process endpoint picker → 4 simulated backends, as a user would run them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import aiohttp
import pytest

from loadtest.harness.processes import KvgateProcess, backend_process, free_port
from tests.integration.metrics_util import scrape, value

PREFIX = "You are the support assistant of a large parcel company; answer briefly. " * 8


@pytest.fixture
def backends() -> Iterator[Callable[..., list[str]]]:
    with ExitStack() as stack:

        def start(count: int, *args: str) -> list[str]:
            ports = [free_port() for _ in range(count)]
            for port in ports:
                stack.enter_context(backend_process(port, *args))
            return [f"127.0.0.1:{p}" for p in ports]

        yield start


def policy(addresses: list[str], extra: str = "", adapters: str = "") -> str:
    return f"""
pools: {{p: {{endpoints: [{", ".join(addresses)}]{adapters}}}}}
routes: [{{model: kvgate-sim, pool: p}}, {{model: sql, pool: p}}]
observability: {{access_log: "off"}}
{extra}
"""


async def complete(
    session: aiohttp.ClientSession,
    url: str,
    prompt: str,
    model: str = "kvgate-sim",
    max_tokens: int = 2,
) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        await response.read()


def hits(addresses: list[str]) -> float:
    return sum(value(f"http://{a}", "vllm:prefix_cache_hits_total") for a in addresses)


async def route_groups(url: str, groups: int = 6, per_group: int = 5) -> None:
    async with aiohttp.ClientSession() as session:
        for round_ in range(per_group):
            for group in range(groups):
                await complete(session, url, f"{group} {PREFIX} question {round_}")
                await asyncio.sleep(0.01)


async def test_shared_prefixes_land_where_they_are_cached(
    backends: Callable[..., list[str]], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    addresses = backends(4, "--cost", "zero")
    epp_url, _ = start_gateway(policy(addresses))
    await route_groups(epp_url)
    prompt_len = len(f"0 {PREFIX} question 0")
    ideal = 6 * 4 * ((prompt_len - 12) // 16 * 16)  # every repeat reuses the group's prefix
    epp_hits = hits(addresses)
    assert epp_hits >= 0.9 * ideal, (epp_hits, ideal)
    # the same traffic with the least-in-flight picker, on fresh backends, hits far less often
    fresh = backends(4, "--cost", "zero")
    plain_url, _ = start_gateway(policy(fresh, "epp: {picker: least-in-flight}"))
    await route_groups(plain_url)
    assert hits(fresh) < 0.75 * epp_hits  # random ties land ~50% of the ideal on average
    picker_metrics = scrape(epp_url)
    assert sum(s.value for s in picker_metrics["kvgate_epp_prefix_index_blocks"]) > 0
    winners = {s.labels["winner"] for s in picker_metrics["kvgate_epp_decisions_total"]}
    assert winners & {"prefix", "backlog"}, winners  # both see what each cache holds


async def test_a_hot_prefix_still_spreads_over_backends(
    backends: Callable[..., list[str]], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    addresses = backends(4, "--cost", "0.02,0.0001,0,0", "--max-num-seqs", "4")
    url, _ = start_gateway(policy(addresses))
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(
            *(complete(session, url, f"{PREFIX} ticket {i}", max_tokens=8) for i in range(32))
        )
    served = [value(f"http://{a}", "vllm:generation_tokens_total") / 8 for a in addresses]
    assert sum(served) == 32
    assert max(served) <= 20, served  # not all on the prefix holder
    assert sum(1 for s in served if s > 0) >= 3, served


async def test_lora_requests_prefer_the_backend_running_the_adapter(
    backends: Callable[..., list[str]], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    """Each backend (one LoRA slot) is busy with a different adapter; `sql` requests go to the
    one running `sql` instead of waiting for a slot elsewhere."""
    adapters = ["chat", "x", "sql", "y"]
    modules = [f"{a}=/adapters/{a}" for a in adapters]
    addresses = backends(4, "--cost", "0.005,0,0,0", "--max-loras", "1", "--lora-modules", *modules)
    lora_profile = """epp:
  plugins:
    - {name: lora, type: lora-affinity-scorer}
    - {name: queue, type: queue-scorer}
    - {name: kv, type: kv-cache-utilization-scorer}
    - {name: pick, type: max-score-picker}
  profiles: [{name: default, plugins: [{ref: lora, weight: 4}, {ref: queue, weight: 1},
                                       {ref: kv, weight: 1}, {ref: pick}]}]
"""
    url, _ = start_gateway(
        policy(addresses, lora_profile, adapters=", adapters: [sql, chat, x, y]")
    )
    async with aiohttp.ClientSession() as session:
        busy = []
        for address, adapter in zip(addresses, adapters, strict=True):
            body = {"model": adapter, "prompt": "keep busy", "max_tokens": 1500, "stream": True}
            response = await session.post(f"http://{address}/v1/completions", json=body)
            await response.content.readline()
            busy.append(response)
        # let the picker scrape who runs what: these requests did not come through it, so the
        # endpoints looked idle, scraped every scrape_idle_interval (200 ms) until now
        await asyncio.sleep(0.5)
        before = [value(f"http://{a}", "vllm:prompt_tokens_total") for a in addresses]
        for i in range(6):
            await complete(session, url, f"select {i} from t{i * 7919}", model="sql")
        after = [value(f"http://{a}", "vllm:prompt_tokens_total") for a in addresses]
        for response in busy:
            response.close()
    gained = [b - a for a, b in zip(before, after, strict=True)]
    assert gained[2] == sum(gained) and gained[2] > 0, gained


async def precise_gateway(
    stack: ExitStack,
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    count: int,
    *backend_args: str,
) -> tuple[str, list[str]]:
    """``count`` zero-cost backends publishing KV events, behind a gateway whose picker runs
    precise prefix mode (prefix x3, queue x1); returns its URL and the backends' addresses."""
    addresses = []
    for _ in range(count):
        port, events = free_port(), free_port()
        args = ("--cost", "zero", "--kv-events-port", str(events), *backend_args)
        stack.enter_context(backend_process(port, *args))
        addresses.append(f"{{address: 127.0.0.1:{port}, kv_events_port: {events}}}")
    url, _ = start_gateway(f"""
pools: {{p: {{endpoints: [{", ".join(addresses)}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
epp:
  plugins:
    - {{name: prefix, type: prefix-cache-scorer, params: {{mode: precise, block_size_tokens: 16}}}}
    - {{name: queue, type: queue-scorer}}
    - {{name: pick, type: max-score-picker}}
  profiles: [{{name: default, plugins: [{{ref: prefix, weight: 3}}, {{ref: queue, weight: 1}}, {{ref: pick}}]}}]
""")
    await asyncio.sleep(0.5)  # let the subscriptions connect
    return url, [a.split("address: ")[1].split(",")[0] for a in addresses]


async def test_precise_mode_learns_from_kv_events(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    """A prefix cached on a backend behind the gateway's back is found through KV events."""
    with ExitStack() as stack:
        url, backends = await precise_gateway(stack, start_gateway, 3)
        async with aiohttp.ClientSession() as session:
            for i, backend in enumerate(backends):
                prompt = f"{i} {PREFIX}"
                await complete(
                    session, f"http://{backend}", prompt
                )  # directly, not via the gateway
            await asyncio.sleep(0.3)
            before = [hits([b]) for b in backends]
            for i in range(len(backends)):
                for _ in range(2):
                    await complete(session, url, f"{i} {PREFIX}")
            gained = [hits([b]) - h for b, h in zip(backends, before, strict=True)]
    prefix_tokens = (len(f"0 {PREFIX}") - 1) // 16 * 16
    assert gained == [2 * prefix_tokens] * 3, gained


async def test_precise_mode_routes_to_a_prefix_held_in_host_memory(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    """Prefixes pushed out of each backend's device cache into its host tier are found there:
    each goes back to the backend whose host memory holds it, and is restored, not computed."""
    with ExitStack() as stack:
        tiny = ("--num-blocks", "24", "--max-model-len", "256", "--cpu-offload-blocks", "128")
        url, backends = await precise_gateway(stack, start_gateway, 2, *tiny)
        prompts = {b: [f"{k}:{b[::-1]} " + "abcdefgh " * 10 for k in range(3)] for b in backends}
        async with aiohttp.ClientSession() as session:
            for backend, own in prompts.items():  # directly: cached there, then pushed out
                for prompt in own + [f"other {k} {backend} " + "z" * 100 for k in range(5)]:
                    await complete(session, f"http://{backend}", prompt)
            await asyncio.sleep(0.3)
            before = [value(f"http://{b}", "kvgate:host_cache_hits_total") for b in backends]
            for k in range(3):
                for own in prompts.values():
                    await complete(session, url, own[k])
        restored = [
            value(f"http://{b}", "kvgate:host_cache_hits_total") - n
            for b, n in zip(backends, before, strict=True)
        ]
    per_prompt = (len(prompts[backends[0]][0]) - 1) // 16 * 16
    assert restored == [3 * per_prompt] * 2, restored


async def test_precise_mode_spreads_distinct_chats_that_share_only_the_template(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    """18 chats whose only common part is the chat template's opening block, sent one at a
    time to 6 idle backends: that sliver (which every backend that served anything holds)
    must not pull them all onto the first backends used."""
    with ExitStack() as stack:
        url, backends = await precise_gateway(stack, start_gateway, 6)
        before = [value(f"http://{b}", "vllm:prompt_tokens_total") for b in backends]
        async with aiohttp.ClientSession() as session:
            for i in range(18):
                body = {
                    "model": "kvgate-sim",
                    "messages": [{"role": "user", "content": f"{i * 7919} " + "distinct " * 20}],
                    "max_tokens": 2,
                }
                async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                    assert response.status == 200, await response.text()
                await asyncio.sleep(0.05)  # the pick's KV events reach the picker
        tokens = [
            value(f"http://{b}", "vllm:prompt_tokens_total") - n
            for b, n in zip(backends, before, strict=True)
        ]
    per_chat = sum(tokens) / 18  # the 18 prompts have nearly the same length
    served = [round(t / per_chat) for t in tokens]
    # ties are broken at random: 4+ backends used and none above 10 fail ~1e-5 of runs
    assert sum(1 for s in served if s > 0) >= 4 and max(served) <= 10, served


async def test_the_approximate_index_is_sized_by_the_backends_own_tokens(
    backends: Callable[..., list[str]], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    """A byte-tokenized backend holds one character per token, not the configured four: the
    index learns it from the answers' usage and holds a quarter of what it first assumed."""
    addresses = backends(2, "--cost", "zero", "--num-blocks", "64", "--max-model-len", "1024")
    url, _ = start_gateway(policy(addresses))
    async with aiohttp.ClientSession() as session:
        for i in range(40):
            await complete(session, url, f"{i:03d} " + f"distinct prompt {i} " * 24)
    picker = scrape(url)
    capacity = {
        s.labels["endpoint"]: s.value for s in picker["kvgate_epp_prefix_index_capacity_blocks"]
    }
    held = {s.labels["endpoint"]: s.value for s in picker["kvgate_epp_prefix_index_blocks"]}
    # 1,024 tokens of about 1 character each, in 64-character blocks: 16, not 64
    assert set(capacity) == set(addresses)
    assert all(15 <= capacity[a] <= 20 for a in addresses), capacity
    assert all(0 < held[a] <= capacity[a] for a in addresses), (held, capacity)


async def test_tokens_in_flight_are_counted_while_a_request_runs_and_return_to_zero(
    backends: Callable[..., list[str]], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    """The picker counts a request's uncached prompt until its first token comes back and its
    output limit until it ends; nothing is left counted afterwards."""
    (address,) = backends(1, "--cost", "0.4,0,0,0")  # every engine step takes 0.4 s
    url, _ = start_gateway(policy([address]))

    def tokens() -> dict[str, float]:
        series = scrape(url)["kvgate_epp_tokens_in_flight"]
        return {s.labels["phase"]: s.value for s in series if s.labels["endpoint"] == address}

    body = {"model": "kvgate-sim", "prompt": PREFIX, "max_tokens": 3, "stream": True}
    async with aiohttp.ClientSession() as session:

        async def stream() -> list[dict[str, float]]:
            seen = []
            async with session.post(f"{url}/v1/completions", json=body) as response:
                assert response.status == 200
                await response.content.readline()  # the first token's event
                await asyncio.sleep(0.05)
                seen.append(tokens())
                await response.read()
            return seen

        running = asyncio.create_task(stream())
        await asyncio.sleep(0.2)  # the prefill step is running (the response head comes with
        during = tokens()  # the first token)
        (after_first,) = await running
    assert during["prefill"] >= len(PREFIX) // 4 * 0.9 and during["decode"] == 3, during
    assert after_first["prefill"] == 0 and after_first["decode"] == 3, after_first
    assert tokens() == {"prefill": 0, "decode": 0}
