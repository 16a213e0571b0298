"""Malformed bodies and headers thrown at a real gateway: never a 500, never a hung connection."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadtest.harness.processes import backend_process, free_port, gateway_process

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {
            "model": st.sampled_from(["kvgate-sim", "nope", "", 3]),
            "prompt": st.one_of(
                st.text(max_size=30), st.lists(st.integers(-5, 300), max_size=5), st.none()
            ),
            "max_tokens": st.one_of(st.integers(-3, 4), st.text(max_size=3), st.none()),
            "stream": st.one_of(st.booleans(), st.text(max_size=3)),
            "stream_options": st.one_of(st.none(), json_values),
        },
    ).map(lambda d: json.dumps(d).encode()),
)
header_value = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
headers = st.dictionaries(
    st.sampled_from(
        [
            "Authorization",
            "api-key",
            "x-request-id",
            "Content-Type",
            "traceparent",
            "Accept-Encoding",
            "X-Custom",
        ]
    ),
    header_value,
    max_size=4,
)
paths = st.sampled_from(
    [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/embeddings",
        "/v1/models",
        "/v1/../admin",
        "/nothing",
    ]
)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    directory: Path = tmp_path_factory.mktemp("fuzz")
    backend_port, gateway_port = free_port(), free_port()
    policy = directory / "policy.yaml"
    policy.write_text(f"""
pools: {{p: {{endpoints: [127.0.0.1:{backend_port}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
listen: {{max_body: 64KiB}}
observability: {{access_log: off}}
""")
    with (
        backend_process(backend_port, "--cost", "zero"),
        gateway_process(str(policy), gateway_port),
    ):
        yield gateway_port


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(path=paths, body=bodies, headers=headers, method=st.sampled_from(["POST", "GET", "PUT"]))
def test_no_500_no_hang(
    gateway: int, path: str, body: bytes, headers: dict[str, str], method: str
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", gateway, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        payload = response.read()
    finally:
        conn.close()
    assert response.status < 500, (response.status, payload[:300])
    if response.status >= 400 and path.startswith("/v1/"):
        error = json.loads(payload)["error"]
        assert {"message", "type", "param", "code"} <= set(error)
