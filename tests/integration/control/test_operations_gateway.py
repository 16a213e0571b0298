"""SLOs and automatic canaries through a real gateway and real simulated backends: a slower
canary is rolled back, an equal one promoted to 100% (and still there after a restart), the
SLO events and budgets are exported, and a spent budget sheds the lower classes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from loadtest.harness.processes import KvgateProcess, free_port
from tests.integration.metrics_util import scrape

TOKEN = "admin-token-0123456789"
ADMIN_KEY, BATCH_KEY = "sk-ops-interactive", "sk-ops-batch"

Start = Callable[..., str]
StartGateway = Callable[..., tuple[str, KvgateProcess]]


def admin(port: int, path: str, method: str = "GET") -> dict[str, object]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        headers={"authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        body = json.loads(response.read())
    assert isinstance(body, dict)
    return body


def canary_policy(
    stable: str, candidate: str, admin_port: int, state: Path, gates: str, min_requests: int = 20
) -> str:
    return f"""
listen: {{admin: {{port: {admin_port}, token: {TOKEN}}}}}
pools:
  stable: {{model: kvgate-sim, endpoints: [{stable.removeprefix("http://")}]}}
  candidate: {{model: kvgate-sim, endpoints: [{candidate.removeprefix("http://")}]}}
routes:
  - model: chat
    pool: stable
    canary:
      pool: candidate
      auto: {{steps: [25, 50, 100], hold: 1s, min_requests: {min_requests}, gates: {{{gates}}}}}
state_dir: {state}
observability: {{access_log: "off"}}
"""


async def drive(url: str, until: Callable[[], bool], *, limit: float = 90.0) -> int:
    """Streamed requests from 6 clients, each sending its next as its last ends (a steady load,
    not bursts), until ``until()`` holds (asked every 0.2 s); the number sent."""
    sent = 0
    done = asyncio.Event()
    body = {"model": "chat", "prompt": "hello canary", "max_tokens": 4, "stream": True}
    async with aiohttp.ClientSession() as session:

        async def client() -> None:
            nonlocal sent
            while not done.is_set():
                async with session.post(f"{url}/v1/completions", json=body) as response:
                    await response.read()
                sent += 1

        clients = [asyncio.create_task(client()) for _ in range(6)]
        deadline = time.monotonic() + limit
        try:
            while not await asyncio.to_thread(until):
                assert time.monotonic() < deadline, "the canary reached no decision in time"
                await asyncio.sleep(0.2)
        finally:
            done.set()
            await asyncio.gather(*clients)
    return sent


def status_of(admin_port: int) -> str:
    return str(admin(admin_port, "/admin/canaries")["chat"]["status"])  # type: ignore[index]


async def assert_none_reach(url: str, backend: str, requests: int) -> None:
    """``requests`` plain completions of the route, all answered, and none by ``backend``."""
    before = sum(s.value for s in scrape(backend)["vllm:request_success_total"])
    body = {"model": "chat", "prompt": "x", "max_tokens": 1}
    async with aiohttp.ClientSession() as session:
        for _ in range(requests):
            async with session.post(f"{url}/v1/completions", json=body) as response:
                assert response.status == 200
    assert sum(s.value for s in scrape(backend)["vllm:request_success_total"]) == before


def the_rollback(admin_port: int) -> dict[str, Any]:
    """The canary's one decision, having checked that it was a rollback to 0% by the gates."""
    summary = admin(admin_port, "/admin/canaries")["chat"]
    assert isinstance(summary, dict)
    assert (summary["status"], summary["weight"]) == ("rolled_back", 0.0)
    (event,) = summary["events"]
    assert event["by"] == "gates" and event["to_weight"] == 0.0
    return dict(event)


async def test_a_failing_canary_is_rolled_back(
    start_backend: Start, start_gateway: StartGateway, tmp_path: Path
) -> None:
    stable = start_backend("--cost", "0.002,0,0,0")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: the canary's requests fail
    port = free_port()
    url, _ = start_gateway(canary_policy(stable, dead, port, tmp_path, "tpot_p95: false"))
    await drive(url, lambda: status_of(port) != "running")
    event = the_rollback(port)
    assert event["breached"] == ["error_rate"]
    arms = event["evidence"]["arms"]
    assert arms["canary"]["error_rate"] == 1.0 and arms["baseline"]["error_rate"] == 0.0


async def test_a_slower_canary_is_rolled_back(
    start_backend: Start, start_gateway: StartGateway, tmp_path: Path
) -> None:
    stable = start_backend("--cost", "0.002,0,0,0")
    slow = start_backend("--cost", "0.05,0,0,0")  # 50 ms a step: TTFT 25x the baseline's
    port = free_port()
    url, _ = start_gateway(canary_policy(stable, slow, port, tmp_path, "tpot_p95: false"))
    await drive(url, lambda: status_of(port) != "running")
    event = the_rollback(port)
    assert event["breached"] == ["ttft_p95"]
    gates = event["evidence"]["gates"]
    assert gates["ttft_p95"]["canary"] > 1.1 * gates["ttft_p95"]["baseline"]
    samples = scrape(url)
    weights = {s.labels["pool"]: s.value for s in samples["kvgate_canary_weight"]}
    assert weights == {"stable": 100.0, "candidate": 0.0}
    decisions = {s.labels["decision"]: s.value for s in samples["kvgate_canary_decisions_total"]}
    assert decisions == {"rollback": 1.0}
    await assert_none_reach(url, slow, 20)  # rolled back: every later request is the baseline's


async def test_an_equal_canary_is_promoted_to_100_and_stays_there_after_a_restart(
    start_backend: Start, start_gateway: StartGateway, tmp_path: Path
) -> None:
    # the same cost model on both: 10 ms a step keeps the latencies well above the noise, and
    # gates of 1.5x over 200 requests an arm leave room for a loaded 2-core machine's jitter
    stable, candidate = (start_backend("--cost", "0.01,0,0,0") for _ in range(2))
    port = free_port()
    gates = "ttft_p95: 1.5x, tpot_p95: 1.5x"
    policy = canary_policy(stable, candidate, port, tmp_path, gates, min_requests=200)
    url, gateway = start_gateway(policy)
    await drive(url, lambda: status_of(port) != "running")
    summary = admin(port, "/admin/canaries")["chat"]
    assert isinstance(summary, dict)
    events = summary["events"]
    assert isinstance(events, list)
    verdicts = [(e.get("breached"), e["evidence"]["gates"]) for e in events]
    assert (summary["status"], summary["weight"]) == ("promoted", 100.0), verdicts
    assert [e["to_weight"] for e in events] == [50.0, 100.0]
    gateway.stop()
    url, _ = start_gateway(policy)
    summary = admin(port, "/admin/canaries")["chat"]
    assert (summary["status"], summary["weight"]) == ("promoted", 100.0)  # type: ignore[index]
    await assert_none_reach(url, stable, 10)  # promoted: every request is the canary's
    # an operator restarts it: back to the first step, recorded as the admin's
    restarted = admin(port, "/admin/canaries/chat/restart", "POST")
    assert (restarted["status"], restarted["weight"]) == ("running", 25.0)


async def test_slo_events_budgets_and_shedding(
    start_backend: Start, start_gateway: StartGateway, tmp_path: Path
) -> None:
    backend = start_backend("--cost", "zero")
    port = free_port()
    keys = "\n".join(
        f"    - {{sha256: {hashlib.sha256(k.encode()).hexdigest()}, tenant: t-{c}, class: {c}}}"
        for k, c in ((ADMIN_KEY, "interactive"), (BATCH_KEY, "batch"))
    )
    dead = f"127.0.0.1:{free_port()}"  # nothing listens: every request fails (5xx)
    url, _ = start_gateway(f"""
listen: {{admin: {{port: {port}, token: {TOKEN}}}}}
auth:
  api_keys:
{keys}
pools:
  sims: {{model: kvgate-sim, endpoints: [{backend.removeprefix("http://")}]}}
  dead: {{model: kvgate-sim, endpoints: [{dead}]}}
routes:
  - {{model: chat, pool: sims}}
  - {{model: broken, pool: dead}}
slos:
  shed_when_exhausted: true
  objectives:
    - {{route: chat, class: interactive, ttft_p95: 2s, availability: 99%}}
    - {{route: broken, availability: 99%}}
retries: {{attempts: 0}}
breakers: {{consecutive_failures: 1000}}
observability: {{access_log: "off"}}
""")

    async def post(session: aiohttp.ClientSession, model: str, key: str) -> int:
        body = {"model": model, "prompt": "slo", "max_tokens": 2, "stream": True}
        headers = {"authorization": f"Bearer {key}"}
        async with session.post(f"{url}/v1/completions", json=body, headers=headers) as response:
            await response.read()
            return response.status

    async with aiohttp.ClientSession() as session:
        statuses = [await post(session, "chat", ADMIN_KEY) for _ in range(30)]
        assert statuses == [200] * 30
        statuses = [await post(session, "broken", BATCH_KEY) for _ in range(120)]
        # every one fails, until the budget is seen spent (refreshed every 5 s) and the rest
        # are shed
        failed, shed = sum(s >= 500 for s in statuses), statuses.count(429)
        assert failed + shed == 120 and failed >= 100
        assert statuses[:failed] == [s for s in statuses if s >= 500]  # shedding comes after
        await asyncio.sleep(6)  # a flush and the gauges' refresh
        samples = scrape(url)
        events = {
            (s.labels["route"], s.labels["slo"], s.labels["good"]): s.value
            for s in samples["kvgate_slo_events_total"]
        }
        assert events[("chat", "availability", "true")] == 30
        assert events[("chat", "ttft_p95", "true")] == 30
        assert events[("broken", "availability", "false")] == failed
        assert events.get(("broken", "availability", "true"), 0) == shed  # not a 5xx
        budgets = {s.labels["route"]: s.value for s in samples["kvgate_slo_budget_remaining"]}
        assert budgets["chat"] == 1.0
        assert budgets["broken"] == pytest.approx(1 - failed / (120 * 0.01))
        report = admin(port, "/admin/slo")
        objectives = report["objectives"]
        assert isinstance(objectives, list)
        broken = next(o for o in objectives if o["route"] == "broken")
        assert broken["shedding"] == ["batch", "standard"]
        # the broken route's budget is spent: its batch callers are refused before any upstream
        async with session.post(
            f"{url}/v1/completions",
            json={"model": "broken", "prompt": "x", "max_tokens": 1},
            headers={"authorization": f"Bearer {BATCH_KEY}"},
        ) as response:
            assert response.status == 429
            assert response.headers["retry-after"] == "30"
            assert (await response.json())["error"]["code"] == "slo_budget_exhausted"
        # the interactive class of a route whose budget holds is served
        assert await post(session, "chat", ADMIN_KEY) == 200
