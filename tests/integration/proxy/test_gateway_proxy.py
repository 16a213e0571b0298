"""The gateway as a drop-in OpenAI proxy: the official client, auth, usage, ids, metrics."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from loadtest.harness.processes import KvgateProcess
from tests.fakes import close_after_test
from tests.integration.gateway_stack import API_KEY, OTHER_KEY, Stack, gateway_stack
from tests.integration.metrics_util import scrape


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with gateway_stack(tmp_path_factory.mktemp("gw"), "--cost", "0.001,0,0,0") as s:
        yield s


def client(stack: Stack, key: str = API_KEY) -> openai.OpenAI:
    return close_after_test(
        openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0, timeout=20)
    )


def test_chat_and_completions_streaming_and_not(stack: Stack) -> None:
    api = client(stack)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello gateway"}]
    chat = api.chat.completions.create(model="kvgate-sim", messages=messages, max_tokens=6)
    assert chat.choices[0].finish_reason == "length" and chat.usage is not None
    streamed = api.chat.completions.create(
        model="kvgate-sim",
        messages=messages,
        max_tokens=6,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == chat.choices[0].message.content
    completion = api.completions.create(model="kvgate-sim", prompt="abc", max_tokens=4)
    assert len(completion.choices[0].text) == 4
    chunks = list(
        api.completions.create(model="kvgate-sim", prompt="abc", max_tokens=4, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == completion.choices[0].text


def test_model_rewrite_for_aliased_route(stack: Stack) -> None:
    # the backend knows only its own name (it answers 404 to any other): it saw the pool's;
    # the client reads the name it asked for, as behind Envoy
    result = client(stack).completions.create(model="public-alias", prompt="x", max_tokens=2)
    assert result.model == "public-alias" and len(result.choices[0].text) == 2


async def _sse_events(stack: Stack, body: dict[str, object]) -> list[bytes]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{stack.url}/v1/completions", json=body, headers=headers) as response,
    ):
        assert response.status == 200
        raw = await response.read()
    return [e for e in raw.split(b"\n\n") if e]


async def test_injected_usage_chunk_is_hidden_unless_asked(stack: Stack) -> None:
    body = {"model": "kvgate-sim", "prompt": "usage?", "max_tokens": 3, "stream": True}
    plain = await _sse_events(stack, body)
    assert plain[-1] == b"data: [DONE]" and not any(b'"usage"' in e for e in plain)
    asked = await _sse_events(stack, {**body, "stream_options": {"include_usage": True}})
    usage = json.loads(asked[-2][len(b"data: ") :])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3


async def test_request_id_is_kept_forwarded_and_returned(stack: Stack) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}", "x-request-id": "req-42.abc"}
    body = {"model": "kvgate-sim", "prompt": "id", "max_tokens": 1}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{stack.url}/v1/completions", json=body, headers=headers) as response,
    ):
        assert response.headers.getall("x-request-id") == ["req-42.abc"]  # once, not the upstream's
        assert (await response.json())["id"] == "cmpl-req-42.abc"  # the backend saw the same id
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{stack.url}/v1/completions", json={**body, "stream": True}, headers=headers
        ) as response,
    ):
        assert response.headers.getall("x-request-id") == ["req-42.abc"]
        assert (await response.read()).endswith(b"data: [DONE]\n\n")
    log = stack.log.read_text()
    entries = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    line = next(e for e in entries if e["request_id"] == "req-42.abc")
    assert line["tenant"] == "acme" and line["status"] == 200 and line["endpoint"]
    assert API_KEY not in log


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer sk-wrong"},
        {"api-key": "sk-wrong"},
        {"Authorization": "Basic x"},
    ],
)
async def test_unauthenticated_calls_are_refused(stack: Stack, headers: dict[str, str]) -> None:
    body = {"model": "kvgate-sim", "prompt": "x", "max_tokens": 1}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{stack.url}/v1/completions", json=body, headers=headers) as response,
    ):
        assert response.status == 401
        assert (await response.json())["error"]["type"] == "authentication_error"


def test_openai_client_with_a_wrong_key(stack: Stack) -> None:
    with pytest.raises(openai.AuthenticationError) as err:
        client(stack, "sk-wrong").completions.create(model="kvgate-sim", prompt="x", max_tokens=1)
    assert err.value.status_code == 401


def test_jwt_callers(stack: Stack) -> None:
    ok = client(stack, stack.keys.token("ES256")).completions.create(
        model="kvgate-sim", prompt="x", max_tokens=1
    )
    assert ok.choices
    with pytest.raises(openai.AuthenticationError):
        client(stack, stack.keys.token(exp=1)).completions.create(model="kvgate-sim", prompt="x")


def test_models_are_filtered_by_caller(stack: Stack) -> None:
    assert {m.id for m in client(stack).models.list()} == {"kvgate-sim", "public-alias"}
    assert {m.id for m in client(stack, OTHER_KEY).models.list()} == {"kvgate-sim"}
    with pytest.raises(openai.NotFoundError):
        client(stack, OTHER_KEY).completions.create(model="public-alias", prompt="x", max_tokens=1)


def test_one_model_is_retrieved_as_the_openai_client_asks(stack: Stack) -> None:
    found = client(stack).models.retrieve("public-alias")
    assert (found.id, found.object, found.owned_by) == ("public-alias", "model", "kvgate")
    for caller, name in ((API_KEY, "no-such-model"), (OTHER_KEY, "public-alias")):
        # a model the caller may not use is as absent as one that does not exist
        with pytest.raises(openai.NotFoundError) as err:
            client(stack, caller).models.retrieve(name)
        assert isinstance(err.value.body, dict) and err.value.body["code"] == "model_not_found"


async def test_head_is_answered_wherever_get_is(stack: Stack) -> None:
    async with aiohttp.ClientSession() as session:
        for path in ("/healthz", "/readyz"):
            async with session.head(f"{stack.url}{path}") as response:
                assert response.status == 200 and int(response.headers["content-length"]) > 0
                assert await response.read() == b""
        async with session.delete(f"{stack.url}/healthz") as response:
            assert response.status == 405 and response.headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize(
    ("data", "status", "code"),
    [
        (b"{oops", 400, None),
        (b"[1, 2, 3]", 400, None),
        (b'{"prompt": "x"}', 400, None),
        (b'{"model": 5, "prompt": "x"}', 400, None),
        (b'{"model": "unknown-model", "prompt": "x"}', 404, "model_not_found"),
        (b'{"model": "kvgate-sim", "prompt": "' + b"x" * 300_000 + b'"}', 413, "request_too_large"),
    ],
)
async def test_bad_requests(stack: Stack, data: bytes, status: int, code: str | None) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{stack.url}/v1/completions", data=data, headers=headers) as response,
    ):
        assert response.status == status
        error = (await response.json())["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == code


def test_metrics_and_health(stack: Stack) -> None:
    client(stack).completions.create(model="kvgate-sim", prompt="m", max_tokens=1)
    samples = scrape(stack.url)
    requests = samples["kvgate_requests_total"]
    assert any(
        s.labels == {"route": "/v1/completions", "model": "kvgate-sim", "status": "200"}
        for s in requests
    )
    assert "kvgate_time_to_first_byte_seconds_bucket" in samples
    assert any(
        s.labels["direction"] == "completion" and s.value >= 1
        for s in samples["kvgate_tokens_total"]
    )
    text = Path(stack.log).read_text()
    assert API_KEY not in text
    import urllib.request

    for path in ("/healthz", "/readyz"):
        with urllib.request.urlopen(stack.url + path) as response:
            assert response.status == 200


def test_the_openai_client_needs_no_registered_key_where_auth_is_off(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    """A drop-in with no `auth:` section: the SDK's mandatory key (any value) is ignored."""
    backend = start_backend("--cost", "zero").removeprefix("http://")
    url, _ = start_gateway(
        f"pools: {{p: {{endpoints: [{backend}]}}}}\nroutes: [{{model: kvgate-sim, pool: p}}]\n"
    )
    sdk = close_after_test(
        openai.OpenAI(base_url=f"{url}/v1", api_key="sk-not-registered-anywhere", max_retries=0)
    )
    answer = sdk.completions.create(model="kvgate-sim", prompt="x", max_tokens=2)
    assert answer.usage is not None and answer.usage.completion_tokens == 2
