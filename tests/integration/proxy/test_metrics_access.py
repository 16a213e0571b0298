"""``/metrics`` on the data listener: it names every endpoint and model, so
by default only loopback clients read it; a bearer of ``observability.metrics.token`` may, and
anyone with ``public: true``. The non-loopback client is this machine's own outward address."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from loadtest.harness.processes import KvgateProcess

POLICY = """
pools: {p: {endpoints: ["127.0.0.1:9"]}}
routes: [{model: m, pool: p}]
auth: {allow_anonymous: true}
"""
TOKEN = "metrics-token-0123456789"


def outward_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # picks the outward interface; sends nothing
        except OSError:
            return ""
        address = str(probe.getsockname()[0])
    return "" if address.startswith("127.") else address


def status(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def outward() -> str:
    address = outward_address()
    if not address:
        pytest.skip("this machine has no non-loopback address to connect from")
    return address


def test_metrics_need_loopback_a_token_or_public(
    outward: str, start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    guarded, _ = start_gateway(
        POLICY + f"observability: {{metrics: {{token: {TOKEN}}}}}", "--host", "0.0.0.0"
    )
    port = guarded.rsplit(":", 1)[1]
    assert status(f"{guarded}/metrics") == 200  # loopback
    assert status(f"http://{outward}:{port}/metrics") == 403
    assert status(f"http://{outward}:{port}/metrics", "wrong-token-0123456789") == 403
    assert status(f"http://{outward}:{port}/metrics", TOKEN) == 200
    assert status(f"http://{outward}:{port}/healthz") == 200  # only metrics are guarded
    public, _ = start_gateway(
        POLICY + "observability: {metrics: {public: true}}", "--host", "0.0.0.0"
    )
    assert status(f"http://{outward}:{public.rsplit(':', 1)[1]}/metrics") == 200


def test_made_up_paths_and_ids_share_one_route_label(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    """A label per path a client makes up would grow the metrics without bound."""
    url, _ = start_gateway(POLICY)
    for number in range(5):
        assert status(f"{url}/made-up/{number}") == 404
        assert status(f"{url}/v1/made-up-{number}") == 404
        assert status(f"{url}/v1/models/m{number}") == 404
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    routes = {
        line.split('route="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("kvgate_requests_total{")
    }
    assert routes == {"other", "/v1/models/{id}"}
