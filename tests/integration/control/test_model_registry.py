"""The model registry through a real gateway, real simulated backends, ``kvgate loadtest`` as
the traffic and ``kvgate models`` as the operator: a version promoted to canary is promoted to
production (or archived) by its canary's verdict with no human step and no failed request, the
stages outlive a restart, and a spent error budget holds the canary at no traffic."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kvgate.cli import main
from loadtest.harness.processes import KvgateProcess, free_port
from tests.integration.metrics_util import scrape

TOKEN = "admin-token-0123456789"
VIEWER = "viewer-token-0123456789"
OPERATOR = "operator-token-012345678"  # the key named release-bot

Start = Callable[..., str]
StartGateway = Callable[..., tuple[str, KvgateProcess]]


def registry_policy(
    v1: str, v2: str, admin_port: int, state: Path, gates: str, extra: str = ""
) -> str:
    return f"""
listen:
  admin:
    port: {admin_port}
    token: {TOKEN}
    keys:
      - {{name: dashboards, token: {VIEWER}, role: viewer}}
      - {{name: release-bot, token: {OPERATOR}, role: operator}}
pools:
  chat-v1: {{model: kvgate-sim, endpoints: [{v1.removeprefix("http://")}]}}
  chat-v2: {{model: kvgate-sim, endpoints: [{v2.removeprefix("http://")}]}}
models:
  chat:
    canary: {{steps: [25, 50, 100], hold: 1s, min_requests: 100, gates: {{{gates}}}}}
    versions:
      - {{version: "1", pool: chat-v1, stage: production, path: /models/chat/1,
         framework: vllm, precision: bf16}}
      - {{version: "2", pool: chat-v2, stage: staging, path: /models/chat/2}}
state_dir: {state}
observability: {{access_log: "off"}}
{extra}"""


def kvgate_models(
    capsys: pytest.CaptureFixture[str], admin_port: int, *args: str, token: str = TOKEN
) -> str:
    """``kvgate models ARGS`` in this process, as the admin (or the key of ``token``); what it
    printed (it must succeed)."""
    capsys.readouterr()
    admin = f"http://127.0.0.1:{admin_port}"
    code = main(["models", "--admin", admin, "--token", token, *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def stages(capsys: pytest.CaptureFixture[str], admin_port: int) -> dict[str, str]:
    listed = json.loads(kvgate_models(capsys, admin_port, "list", "--json"))
    return {v["version"]: v["stage"] for v in listed["chat"]["versions"]}


def loadtest(url: str, out: Path, seconds: float) -> subprocess.Popen[bytes]:
    """``kvgate loadtest``: six clients sending short completions of ``chat`` for ``seconds``."""
    command = [sys.executable, "-m", "kvgate", "loadtest", "--url", url, "--model", "chat"]
    command += ["--endpoint", "completions", "--workload", "random", "--input-tokens", "16"]
    command += ["--output-tokens", "4", "--concurrency", "6", "--duration", str(seconds)]
    command += ["--num-requests", "100000"]  # --duration ends it
    command += ["--out", str(out), "--no-plots", "--no-progress"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def until(check: Callable[[], bool], limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"{what} did not happen in {limit:g} s"
        await asyncio.sleep(0.25)


def finished(load: subprocess.Popen[bytes], out: Path) -> dict[str, object]:
    _, stderr = load.communicate(timeout=120)
    assert load.returncode == 0, stderr.decode()
    result: dict[str, object] = json.loads((out / "results.json").read_text())
    return result


async def complete(url: str, requests: int) -> None:
    """``requests`` completions of ``chat``, one after another, each answered."""
    async with aiohttp.ClientSession() as session:
        for _ in range(requests):
            body = {"model": "chat", "prompt": "after", "max_tokens": 1}
            async with session.post(f"{url}/v1/completions", json=body) as response:
                assert response.status == 200


def served(backend: str) -> float:
    return sum(s.value for s in scrape(backend).get("vllm:request_success_total", []))


async def test_a_canary_version_is_promoted_by_its_verdict_and_the_stages_outlive_a_restart(
    start_backend: Start,
    start_gateway: StartGateway,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    v1, v2 = (start_backend("--cost", "0.01,0,0,0") for _ in range(2))  # equal versions
    port = free_port()
    # gates of 3x: the same engine behind both arms, on a loaded 2-core machine
    policy = registry_policy(v1, v2, port, tmp_path, "ttft_p95: 3x, tpot_p95: 3x")
    url, gateway = start_gateway(policy)
    load = loadtest(url, tmp_path / "load", 30)
    await asyncio.sleep(2)  # traffic before, during and after the switch
    assert served(v2) == 0
    promoted = kvgate_models(capsys, port, "promote", "chat", "2", token=OPERATOR)
    assert promoted.splitlines()[0] == "chat 2: canary"
    await until(
        lambda: stages(capsys, port) == {"1": "archived", "2": "production"}, 60, "promotion"
    )
    result = finished(load, tmp_path / "load")
    assert result["failed"] == 0 and result["completed"], result  # none failed on the switch
    listed = json.loads(kvgate_models(capsys, port, "list", "--json"))["chat"]
    changes = [(e["version"], e["action"], e["by"], e["to"]) for e in listed["events"]]
    assert changes == [
        ("2", "promote", "release-bot", "canary"),  # the operator who made the change
        ("2", "promote", "canary", "production"),
    ]
    assert [v["share"] for v in listed["versions"]] == [0.0, 100.0]
    assert listed["versions"][0]["path"] == "/models/chat/1"
    table = kvgate_models(capsys, port, "list")
    assert "chat                 2          production   100.0%  chat-v2" in table
    samples = scrape(url)
    stage = {
        (s.labels["version"], s.labels["stage"]) for s in samples["kvgate_model_stage"] if s.value
    }
    assert stage == {("1", "archived"), ("2", "production")}
    gateway.stop()
    url, _ = start_gateway(policy)  # the saved stages, not the declared ones
    assert stages(capsys, port) == {"1": "archived", "2": "production"}
    before = served(v1)
    await complete(url, 10)
    assert served(v1) == before  # production is version 2


async def test_a_slower_canary_version_is_archived_and_production_keeps_the_traffic(
    start_backend: Start,
    start_gateway: StartGateway,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    v1 = start_backend("--cost", "0.002,0,0,0")
    v2 = start_backend("--cost", "0.05,0,0,0")  # TTFT 25x production's
    port = free_port()
    url, _ = start_gateway(registry_policy(v1, v2, port, tmp_path, "tpot_p95: false"))
    load = loadtest(url, tmp_path / "load", 20)
    await asyncio.sleep(1)
    kvgate_models(capsys, port, "promote", "chat", "2")
    await until(lambda: stages(capsys, port)["2"] == "archived", 60, "the rollback")
    assert stages(capsys, port) == {"1": "production", "2": "archived"}
    result = finished(load, tmp_path / "load")
    assert result["failed"] == 0, result
    listed = json.loads(kvgate_models(capsys, port, "list", "--json"))["chat"]
    last = listed["events"][-1]
    assert (last["action"], last["by"], last["to"]) == ("rollback", "canary", "archived")
    served_by_v2 = served(v2)
    assert served_by_v2 > 0  # the canary had its share
    await complete(url, 10)
    assert served(v2) == served_by_v2  # everything back on production
    # the archived version may come back to staging; production may not be archived
    kvgate_models(capsys, port, "promote", "chat", "2")
    assert stages(capsys, port)["2"] == "staging"
    capsys.readouterr()
    admin = f"http://127.0.0.1:{port}"
    refused = main(["models", "--admin", admin, "--token", TOKEN, "archive", "chat", "1"])
    error = capsys.readouterr().err
    assert refused == 1 and "409: version 1 is in production" in error, error


async def test_a_spent_error_budget_holds_the_canary_and_the_admin_api_says_why(
    start_backend: Start,
    start_gateway: StartGateway,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    v1, v2 = start_backend("--cost", "0.002,0,0,0"), start_backend("--cost", "0.002,0,0,0")
    port = free_port()
    # every request misses a 1 ms TTFT: the budget is spent after 20 requests
    slos = "slos: {objectives: [{route: chat, ttft_p95: 1ms}]}"
    url, _ = start_gateway(registry_policy(v1, v2, port, tmp_path, "", slos))
    async with aiohttp.ClientSession() as session:
        for _ in range(40):
            body = {"model": "chat", "prompt": "spend", "max_tokens": 2, "stream": True}
            async with session.post(f"{url}/v1/completions", json=body) as response:
                assert response.status == 200
                await response.read()  # the whole stream (a client that leaves is not counted)
        admin = f"http://127.0.0.1:{port}/admin/models"
        viewer = {"Authorization": f"Bearer {VIEWER}"}
        async with session.post(f"{admin}/chat/2/promote", headers=viewer) as response:
            assert response.status == 403  # a viewer reads, no more
        operator = {"Authorization": f"Bearer {TOKEN}"}
        async with session.post(f"{admin}/chat/9/promote", headers=operator) as response:
            assert response.status == 404
        async with session.post(f"{admin}/chat/1/archive", headers=operator) as response:
            assert response.status == 409
            assert "in production" in (await response.json())["error"]["message"]
        async with session.post(f"{admin}/chat/2/deploy", headers=operator) as response:
            assert response.status == 400

    def listed() -> dict[str, Any]:
        found: dict[str, Any] = json.loads(kvgate_models(capsys, port, "list", "--json"))["chat"]
        return found

    await until(lambda: listed()["slo"]["verdict"] == "exhausted", 10, "the budget's end")
    assert listed()["slo"]["budget_spent"] >= 1
    kvgate_models(capsys, port, "promote", "chat", "2")
    await until(lambda: listed()["canary"].get("status") == "waiting", 10, "the canary's wait")
    await asyncio.sleep(2)  # a few ticks: still waiting, no traffic
    now = listed()
    assert now["canary"]["status"] == "waiting" and now["canary"]["held_by_budget"] >= 1
    assert [v["share"] for v in now["versions"]] == [100.0, 0.0]
    table = kvgate_models(capsys, port, "list")
    assert "canary waiting" in table and "exhausted" in table
    assert served(v2) == 0
