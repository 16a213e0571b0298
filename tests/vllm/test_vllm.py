"""kvgate in front of real vLLM servers (the CPU build, a tiny local Llama): the tokenizer
agrees with vLLM's own, the gateway proxies it for the official client, the EPP reads its
metrics, LoRA residency and KV events, and precise routing follows what the engines cache."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import anthropic
import grpc
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from bench.envoy_messages import body_messages, headers_message
from epp.datalayer.indexes.precise import PreciseIndex, block_keys
from epp.datalayer.kv_events import KVEventSubscriber
from epp.datalayer.metrics_parser import VLLM, parse_metrics
from epp.datalayer.scraper import filtered_path
from epp.datalayer.tokenize import make_tokenizer, request_token_ids
from epp.framework import Endpoint, EndpointMetadata
from kvgate.api.envoy import external_processor_pb2_grpc as ep_grpc
from loadtest.client.sse import stream_request
from loadtest.harness.processes import epp_process, free_port, gateway_process
from loadtest.harness.vllm import VllmServer
from tests.fakes import close_after_test
from tests.http_servers import ConnectionCount
from tests.integration.metrics_util import scrape as scrape_gateway

BLOCK = 128  # vLLM's block size on CPU
KEY = "vllm-tier-key"  # the gateway's API key for these tests
SYSTEM = "You route parcels between depots and answer in one short sentence. " * 14
CHATS = [
    [{"role": "user", "content": "hello"}],
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "where is my parcel?"}],
    [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
    ],
]
PROMPTS = ["hello world", SYSTEM, "  spaces  and\nnewlines\t", "ünïcödé"]


def scrape(server: VllmServer, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"{server.url}{path}", timeout=10) as response:
        text: str = response.read().decode()
    return text


def counter(server: VllmServer, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in scrape(server).splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def test_the_tokenizer_agrees_with_vllms_own(
    vllm_servers: list[VllmServer], tiny_model: str
) -> None:
    server = vllm_servers[0]
    tokenizer = make_tokenizer(tiny_model)
    for prompt in PROMPTS:
        theirs = server.post("/tokenize", {"model": server.name, "prompt": prompt})["tokens"]
        assert request_token_ids({"prompt": prompt}, tokenizer) == theirs, prompt
    for messages in CHATS:
        body = {"model": server.name, "messages": messages}
        theirs = server.post("/tokenize", body)["tokens"]
        assert request_token_ids({"messages": messages}, tokenizer) == theirs, messages


@pytest.fixture(scope="module")
def gateway(
    vllm_servers: list[VllmServer], tiny_model: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """A gateway over both servers in precise mode, and the policy file it serves."""
    directory = tmp_path_factory.mktemp("gateway")
    endpoints = ", ".join(
        f"{{address: {s.address}, kv_events_port: {s.events_port}, "
        f"kv_events_replay_port: {s.replay_port}}}"
        for s in vllm_servers
    )
    policy = directory / "policy.yaml"
    policy.write_text(f"""
pools:
  vllm:
    engine: vllm
    adapters: [sql]
    endpoints: [{endpoints}]
routes: [{{model: tiny-llama, pool: vllm}}, {{model: sql, pool: vllm}}]
auth: {{api_keys: [{{sha256: {hashlib.sha256(KEY.encode()).hexdigest()}, tenant: tier}}]}}
epp:
  plugins:
    - {{name: prefix, type: prefix-cache-scorer, params: {{mode: precise, block_size_tokens: {BLOCK}, tokenizer: {tiny_model}}}}}
    - {{name: queue, type: queue-scorer}}
    - {{name: kv, type: kv-cache-utilization-scorer}}
    - {{name: pick, type: max-score-picker}}
  profiles: [{{name: default, plugins: [{{ref: prefix, weight: 3}}, {{ref: queue, weight: 1}}, {{ref: kv, weight: 1}}, {{ref: pick}}]}}]
""")
    port = free_port()
    with gateway_process(str(policy), port, log=str(directory / "gateway.log")):
        yield f"http://127.0.0.1:{port}", str(policy)


def test_the_gateway_proxies_vllm_for_the_official_client(gateway: tuple[str, str]) -> None:
    url, _ = gateway
    client = close_after_test(openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0))
    completion = client.completions.create(model="tiny-llama", prompt="hello", max_tokens=4)
    assert completion.usage is not None and completion.usage.completion_tokens == 4
    stream = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    # the same long prompt twice: the second is served from the engine's prefix cache
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "hi"},
    ]
    client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=1)
    again = client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=1)
    details = again.usage.prompt_tokens_details if again.usage else None
    assert details is not None and (details.cached_tokens or 0) >= BLOCK
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError):  # vLLM's own 400, passed through
        client.completions.create(model="tiny-llama", prompt="x", max_tokens=100_000)


def test_responses_through_the_gateway_reach_the_engine_that_stored_them(
    gateway: tuple[str, str],
) -> None:
    """vLLM keeps each response in its own process: retrieve and continue must go there."""
    url, _ = gateway
    client = close_after_test(openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0))
    made = [
        client.responses.create(
            model="tiny-llama", instructions=SYSTEM, input=f"parcel {n}?", max_output_tokens=3
        )
        for n in range(4)
    ]
    for response in made:
        assert response.usage is not None and response.usage.input_tokens > BLOCK
        assert client.responses.retrieve(response.id).id == response.id
        more = client.responses.create(
            model="tiny-llama", input="and?", previous_response_id=response.id, max_output_tokens=2
        )
        # the other engine has never seen it and would answer 404
        assert more.previous_response_id == response.id and more.output
    events = list(
        client.responses.create(
            model="tiny-llama", input="stream", max_output_tokens=3, stream=True
        )
    )
    assert events[-1].type in ("response.completed", "response.incomplete")


def test_anthropic_messages_through_the_gateway_are_served_by_vllm_natively(
    gateway: tuple[str, str],
) -> None:
    """vLLM's own ``/v1/messages``: whole and streamed, routed on the system prompt (the
    second finds it cached), metered in chat terms, vLLM's refusals passed on as it shaped
    them."""
    url, _ = gateway

    def metered() -> dict[str, float]:
        tokens = scrape_gateway(url).get("kvgate_tokens_total", [])
        return {s.labels["direction"]: s.value for s in tokens}

    before = metered()
    client = close_after_test(anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0))
    hello: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hi"}]
    answers = [
        client.messages.create(model="tiny-llama", system=SYSTEM, messages=hello, max_tokens=3)
        for _ in range(2)
    ]
    assert answers[0].type == "message" and answers[0].model == "tiny-llama"
    assert (answers[1].usage.cache_read_input_tokens or 0) >= BLOCK
    with client.messages.stream(
        model="tiny-llama", system=SYSTEM, messages=hello, max_tokens=3
    ) as stream:
        text = "".join(stream.text_stream)
        answers.append(stream.get_final_message())
    assert 1 <= answers[-1].usage.output_tokens <= 3
    assert text == "".join(b.text for b in answers[-1].content if b.type == "text")
    after = metered()
    prompt = sum(  # Anthropic's three parts of a prompt: uncached, read and written
        a.usage.input_tokens
        + (a.usage.cache_read_input_tokens or 0)
        + (a.usage.cache_creation_input_tokens or 0)
        for a in answers
    )
    assert after["prompt"] - before.get("prompt", 0) == prompt
    output = sum(a.usage.output_tokens for a in answers)
    assert after["completion"] - before.get("completion", 0) == output
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="no-such-model", messages=hello, max_tokens=1)
    with pytest.raises(anthropic.BadRequestError) as refused:  # vLLM's own 400
        client.messages.create(model="tiny-llama", messages=hello, max_tokens=20_000)
    assert isinstance(refused.value.body, dict) and refused.value.body["type"] == "error"


def test_the_epp_reads_real_metrics(vllm_servers: list[VllmServer]) -> None:
    server = vllm_servers[0]
    # vLLM sets lora_requests_info when it records an engine step's stats, not at once: a
    # request makes one whatever ran before this test, then wait up to 60 s for the gauge (it
    # failed in CI waiting 30 s while the machine was busy)
    server.post("/v1/completions", {"model": server.name, "prompt": "stats", "max_tokens": 2})
    metrics = parse_metrics(scrape(server))
    for _ in range(240):
        if metrics.max_loras:
            break
        time.sleep(0.25)
        metrics = parse_metrics(scrape(vllm_servers[0]))
    assert metrics.block_size == BLOCK and metrics.num_gpu_blocks > 0
    assert 0.0 <= metrics.kv_usage <= 1.0 and metrics.waiting == 0
    assert metrics.max_loras == 2
    # the scraper asks for only the series it reads: vLLM answers with what it reads from
    filtered = parse_metrics(scrape(vllm_servers[0], filtered_path(VLLM)))
    assert (filtered.block_size, filtered.num_gpu_blocks, filtered.max_loras) == (
        metrics.block_size,
        metrics.num_gpu_blocks,
        metrics.max_loras,
    )


def test_lora_residency_from_real_lora_requests_info(
    vllm_servers: list[VllmServer], tiny_model: str
) -> None:
    server = vllm_servers[1]
    adapter = Path(tiny_model).parent / "lora-sql"
    server.post("/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(adapter)})
    client = close_after_test(
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    )
    done = threading.Event()

    def keep_the_adapter_busy() -> None:
        """Requests on the adapter, one after another: vLLM reports the running adapters
        once per stats interval (1 s here), and one answer may be over before that."""
        while not done.is_set():
            client.completions.create(model="sql", prompt="select", max_tokens=300)

    busy = threading.Thread(target=keep_the_adapter_busy, daemon=True)
    busy.start()
    seen: set[str] = set()
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:
        seen |= parse_metrics(scrape(server)).running_loras
        time.sleep(0.1)
    done.set()
    busy.join(timeout=60)
    assert seen == {"sql"}


async def test_precise_routing_follows_the_engines_kv_events(
    vllm_servers: list[VllmServer], gateway: tuple[str, str], tiny_model: str
) -> None:
    url, _ = gateway
    a, b = vllm_servers
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "Precise. " + SYSTEM},
        {"role": "user", "content": "q"},
    ]
    # cached on b behind the gateway's back: only b's KV events can tell
    direct = close_after_test(
        openai.OpenAI(base_url=f"{b.url}/v1", api_key="unused", max_retries=0)
    )
    direct.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=1)
    await asyncio.sleep(1.0)
    before = [counter(s, "vllm:prefix_cache_hits_total") for s in (a, b)]
    client = close_after_test(openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0))
    for turn in range(3):
        question: ChatCompletionMessageParam = {"role": "user", "content": f"question {turn}"}
        asked = [*messages[:1], question]
        client.chat.completions.create(model="tiny-llama", messages=asked, max_tokens=1)
    gained = [
        counter(s, "vllm:prefix_cache_hits_total") - h for s, h in zip((a, b), before, strict=True)
    ]
    prefix = (
        len(request_token_ids({"messages": messages}, make_tokenizer(tiny_model))) // BLOCK * BLOCK
    )
    assert gained[1] >= 3 * prefix and gained[0] == 0, (gained, prefix)


def test_ext_proc_picks_the_engine_the_embedded_picker_picks(
    vllm_servers: list[VllmServer], gateway: tuple[str, str], tiny_model: str
) -> None:
    _, policy = gateway
    a = vllm_servers[0]
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "Envoy. " + SYSTEM},
        {"role": "user", "content": "q"},
    ]
    openai.OpenAI(base_url=f"{a.url}/v1", api_key="unused", max_retries=0).chat.completions.create(
        model="tiny-llama", messages=messages, max_tokens=1
    )
    grpc_port, metrics_port = free_port(), free_port()
    with epp_process(policy, grpc_port, metrics_port):
        time.sleep(1.0)  # the subscriber connects; the replay brings a's history
        body = json.dumps({"model": "tiny-llama", "messages": messages}).encode()
        headers = {
            ":path": "/v1/chat/completions",
            ":method": "POST",
            "content-type": "application/json",
        }
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            replies = list(
                ep_grpc.ExternalProcessorStub(channel).Process(  # type: ignore[no-untyped-call]
                    iter([headers_message(headers), *body_messages(body)]), timeout=10
                )
            )
    mutation = replies[0].request_headers.response.header_mutation
    chosen = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
    assert chosen["x-gateway-destination-endpoint"] == a.address


async def test_a_restarted_engine_is_cleared_from_the_index(
    vllm_servers: list[VllmServer], tiny_model: str
) -> None:
    """Last in this file: it restarts a server. Its sequence numbers start again at 0, so the
    subscriber clears what it knew of the old process."""
    server = vllm_servers[1]
    endpoint = Endpoint(EndpointMetadata(server.address, "p", kv_events_port=server.events_port))
    index = PreciseIndex()
    subscriber = KVEventSubscriber(index, [endpoint])
    tokenizer = make_tokenizer(tiny_model)
    await subscriber.start()
    try:
        await asyncio.sleep(0.5)
        old = "Before the restart. " + SYSTEM
        server.post("/v1/completions", {"model": server.name, "prompt": old, "max_tokens": 1})
        old_keys = block_keys(request_token_ids({"prompt": old}, tokenizer), BLOCK)
        assert old_keys and await held(index, old_keys, server.address)
        assert index.last_seq(server.address, 0) >= 0  # vLLM 0.32 sends its rank: 0
        server.stop()
        server.start()
        await asyncio.to_thread(server.wait_ready)
        await asyncio.sleep(1.0)  # the subscription reconnects
        new = "After the restart. " + SYSTEM
        server.post("/v1/completions", {"model": server.name, "prompt": new, "max_tokens": 1})
        new_keys = block_keys(request_token_ids({"prompt": new}, tokenizer), BLOCK)
        assert await held(index, new_keys, server.address)
        assert index.restarts == 1
        assert index.match(old_keys, [server.address]) == {server.address: 0}
    finally:
        await subscriber.stop()


async def held(index: PreciseIndex, keys: list[int], address: str) -> bool:
    """Whether ``index`` comes to hold all of ``keys`` for ``address`` within 5 s."""
    for _ in range(100):
        if index.match(keys, [address])[address] == len(keys):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_streams_from_vllm_keep_their_connections(
    gateway: tuple[str, str], vllm_servers: list[VllmServer]
) -> None:
    """vLLM (uvicorn) ends a stream's body apart from ``[DONE]``: through the gateway a client
    that stops at ``[DONE]`` still keeps its connection, and so does the load tester's client
    straight to vLLM (it reads the body to its end)."""
    url, _ = gateway
    body = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 2, "stream": True}
    through_gateway = ConnectionCount()
    headers = {"authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession(trace_configs=[through_gateway.trace]) as session:
        for _ in range(12):
            async with session.post(f"{url}/v1/completions", json=body, headers=headers) as reply:
                async for line in reply.content:
                    if line.strip() == b"data: [DONE]":
                        break
    direct = ConnectionCount()
    async with aiohttp.ClientSession(trace_configs=[direct.trace]) as session:
        for _ in range(12):
            result = await stream_request(session, f"{vllm_servers[0].url}/v1/completions", body)
            assert result.done and not result.error
    assert (through_gateway.made, direct.made) == (1, 1)


def _events(server: VllmServer, path: str, body: dict[str, object]) -> list[bytes]:
    """The SSE events of a streamed request, as sent (``data: ...\\n\\n``)."""
    request = urllib.request.Request(
        f"{server.url}{path}",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        raw = response.read()
    return [event + b"\n\n" for event in raw.replace(b"\r\n", b"\n").split(b"\n\n") if event]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_broken_stream_s_continuation_goes_on_as_vllm_would_have(
    vllm_servers: list[VllmServer], tiny_model: str, path: str
) -> None:
    """The continuation the gateway sends when an engine dies mid-stream, sent to a real vLLM:
    from the token ids it returns, greedy decoding goes on token for token; from the text
    (``continue_final_message``), vLLM takes it and renders it as kvgate's tokenizer does."""
    from gateway.request.continuation import Progress, continuation
    from kvgate.wire.sse import without_token_ids

    server = vllm_servers[0]
    chat = path.endswith("chat/completions")
    body: dict[str, object] = {"model": server.name, "max_tokens": 24, "temperature": 0}
    body |= {"messages": CHATS[1]} if chat else {"prompt": SYSTEM}
    whole = _events(server, path, {**body, "return_token_ids": True})
    reference = Progress.of(chat, whole)
    assert reference.token_ids is not None and len(reference.token_ids) == 24
    assert reference.prompt_token_ids is not None
    cut = 8  # events the client had when the engine died
    sent = Progress.of(chat, whole[:cut])
    assert sent.token_ids is not None and 0 < len(sent.token_ids) < 24
    path_on, going_on = continuation(body, sent, token_ids=True)
    assert path_on == "/v1/completions"
    rest = Progress.of(False, _events(server, path_on, going_on))
    assert sent.token_ids + (rest.token_ids or []) == reference.token_ids
    by_text = Progress.of(chat, [without_token_ids(e) for e in whole[:cut]])
    assert by_text.token_ids is None
    path_on, going_on = continuation(body, by_text, token_ids=False)
    assert path_on == path  # accepted, and answered to its end (the text may be empty)
    assert Progress.of(chat, _events(server, path_on, going_on)).finish_reason == "length"
    if chat:
        messages = going_on["messages"]
        theirs = server.post(
            "/tokenize",
            {
                "model": server.name,
                "messages": messages,
                "continue_final_message": True,
                "add_generation_prompt": False,
            },
        )["tokens"]
        tokenizer = make_tokenizer(tiny_model)
        assert tokenizer.chat_ids(messages, continue_final=True) == theirs  # type: ignore[arg-type]
