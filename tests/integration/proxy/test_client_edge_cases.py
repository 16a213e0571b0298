"""Real clients through a real gateway (HTTP edge cases): curl's own
``Expect: 100-continue`` on large bodies, h2c upgrades from ``curl --http2`` and Java's
``HttpClient``, ``Date``, and ``X-Forwarded-For``/``-Proto`` with the client address in the
access log. The upstream is an aiohttp app on loopback that records the headers it gets."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from loadtest.harness.processes import KvgateProcess
from tests.http_servers import serving

COMPLETION = {
    "id": "cmpl-1",
    "object": "text_completion",
    "model": "m",
    "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
CLIENTS = Path(__file__).parents[1] / "clients"


class Recorder:
    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        return web.json_response(COMPLETION)


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Recorder, int]]:
    recorder = Recorder()
    app = web.Application(client_max_size=16 * 2**20)
    app.router.add_post("/v1/completions", recorder.handle)
    async with serving(app) as port:
        yield recorder, port


@pytest.fixture
def gateway(
    upstream: tuple[Recorder, int],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> tuple[str, KvgateProcess]:
    _, port = upstream
    return start_gateway(f"""
listen: {{trusted_proxies: ["127.0.0.0/8"]}}
epp: {{picker: least-in-flight}}
pools: {{p: {{endpoints: ["127.0.0.1:{port}"]}}}}
routes: [{{model: m, pool: p}}]
""")


async def run(*command: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_large_body_with_its_own_expect_continue(
    gateway: tuple[str, KvgateProcess], upstream: tuple[Recorder, int], tmp_path: Path
) -> None:
    url, _ = gateway
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"model": "m", "prompt": "hi", "user": "u" * (2 * 2**20)}))
    done = await run(
        "curl", "-sv", "--data-binary", f"@{body}", "-H", "content-type: application/json",
        f"{url}/v1/completions",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "> Expect: 100-continue" in done.stderr  # curl asked, by itself
    assert done.stderr.count("< HTTP/1.1 100 Continue") == 1
    assert "< HTTP/1.1 200 OK" in done.stderr and "< date: " in done.stderr
    assert json.loads(done.stdout)["choices"][0]["text"] == "ok"
    recorder, _ = upstream
    assert "expect" not in recorder.headers[-1]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_http2_upgrade_is_answered_over_http11(
    gateway: tuple[str, KvgateProcess], upstream: tuple[Recorder, int]
) -> None:
    url, _ = gateway
    done = await run(
        "curl", "-sv", "--http2", "-d", '{"model": "m", "prompt": "hi"}',
        "-H", "content-type: application/json", f"{url}/v1/completions",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "> Upgrade: h2c" in done.stderr and "< HTTP/1.1 200 OK" in done.stderr
    assert json.loads(done.stdout)["choices"][0]["text"] == "ok"
    recorder, _ = upstream
    sent = recorder.headers[-1]
    assert "upgrade" not in sent and "http2-settings" not in sent


@pytest.mark.skipif(shutil.which("javac") is None, reason="no JDK")
async def test_java_http_client_defaults(
    gateway: tuple[str, KvgateProcess], tmp_path: Path
) -> None:
    url, _ = gateway
    compiled = await run("javac", "-d", str(tmp_path), str(CLIENTS / "H2cPost.java"))
    assert compiled.returncode == 0, compiled.stderr
    done = await run(
        "java", "-cp", str(tmp_path), "H2cPost", f"{url}/v1/completions",
        '{"model": "m", "prompt": "hi"}',
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    status, body = done.stdout.split("\n", 1)
    assert status == "HTTP_1_1 200"
    assert json.loads(body)["choices"][0]["text"] == "ok"


async def test_forwarded_headers_and_the_client_address_in_the_log(
    gateway: tuple[str, KvgateProcess], upstream: tuple[Recorder, int]
) -> None:
    url, process = gateway
    recorder, _ = upstream
    body = {"model": "m", "prompt": "hi"}
    async with aiohttp.ClientSession() as session:
        for headers in (
            {"x-request-id": "direct"},
            {"x-request-id": "proxied", "x-forwarded-for": "203.0.113.7, 10.0.0.2",
             "x-forwarded-proto": "https"},
        ):  # fmt: skip
            async with session.post(f"{url}/v1/completions", json=body, headers=headers) as r:
                assert r.status == 200 and "Date" in r.headers
    direct, proxied = recorder.headers[-2:]
    assert (direct["x-forwarded-for"], direct["x-forwarded-proto"]) == ("127.0.0.1", "http")
    # the peer is a trusted proxy: its scheme is kept, and the chain gets the peer appended
    assert proxied["x-forwarded-for"] == "203.0.113.7, 10.0.0.2, 127.0.0.1"
    assert proxied["x-forwarded-proto"] == "https"
    assert process.log is not None
    log = await asyncio.to_thread(Path(process.log).read_text)
    entries = [json.loads(x) for x in log.splitlines() if x[:1] == "{"]
    clients = {e["request_id"]: e["client"] for e in entries if "client" in e}
    # 10.0.0.2 is not trusted: it is the first untrusted hop from the right
    assert clients == {"direct": "127.0.0.1", "proxied": "10.0.0.2"}
