"""kvgate's rules and dashboards against a real Prometheus: it scrapes a gateway and simulated
backends under a short load, every dashboard panel's query returns data, and induced faults
fire their alerts (a slower canary: KvgateCanaryRolledBack; a dead model server:
KvgateBackendDown; its endpoint's breaker: KvgateBreakerOpen).

The rules are loaded as written but for their ``for:`` durations, set to 0 so that a
one-minute test can see them fire (``promtool test rules`` checks the durations).
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from loadtest.harness.processes import KvgateProcess, free_port
from tests.integration.prometheus_server import PrometheusServer

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "kvgate-rules.yml"
TOKEN = "admin-token-0123456789"


def dashboard_queries() -> dict[str, str]:
    """Every panel's query, by "dashboard: panel" (from the generator the JSON comes from)."""
    spec = importlib.util.spec_from_file_location("generate", ROOT / "deploy/grafana/generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["generate"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return {
        f"{uid}: {chart.title}": chart.expr
        for uid, (_, charts) in module.DASHBOARDS.items()
        for chart in charts
    }


def immediate_rules(directory: Path) -> Path:
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "0s"
    path = directory / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    return path


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[PrometheusServer]:
    server = PrometheusServer(tmp_path, free_port())
    yield server
    server.stop()


async def load(url: str, seconds: float) -> None:
    """Streamed chat requests and plain requests of the pool with a dead endpoint."""
    chat = {"model": "chat", "prompt": "the prometheus stack", "max_tokens": 4, "stream": True}
    mixed = {"model": "mixed", "prompt": "mixed pool", "max_tokens": 2}
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:

        async def one(body: dict[str, object]) -> None:
            async with session.post(f"{url}/v1/completions", json=body) as response:
                await response.read()

        while time.monotonic() < deadline:
            await asyncio.gather(*(one(chat) for _ in range(6)), one(mixed), one(mixed))


async def test_dashboards_have_data_and_faults_fire_their_alerts(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    prometheus: PrometheusServer,
    tmp_path: Path,
) -> None:
    stable = start_backend("--cost", "0.002,0,0,0")
    slow = start_backend("--cost", "0.05,0,0,0")
    mirror, live = start_backend("--cost", "zero"), start_backend("--cost", "zero")
    dead = f"127.0.0.1:{free_port()}"
    hosts = {name: url.removeprefix("http://") for name, url in
             {"stable": stable, "candidate": slow, "mirror": mirror, "mixed": live}.items()}  # fmt: skip
    admin_port = free_port()
    url, _ = start_gateway(f"""
listen: {{admin: {{port: {admin_port}, token: {TOKEN}}}}}
pools:
  stable: {{model: kvgate-sim, endpoints: [{hosts["stable"]}]}}
  candidate: {{model: kvgate-sim, endpoints: [{hosts["candidate"]}]}}
  mirror: {{model: kvgate-sim, endpoints: [{hosts["mirror"]}]}}
  mixed: {{model: kvgate-sim, endpoints: [{hosts["mixed"]}, {dead}]}}
routes:
  - model: chat
    pool: stable
    canary:
      pool: candidate
      auto: {{steps: [25, 50, 100], hold: 1s, min_requests: 20, gates: {{tpot_p95: false}}}}
    shadow: {{pool: mirror, sample: 1.0, max_in_flight: 16}}
  - {{model: mixed, pool: mixed}}
limits: {{rules: [{{name: everyone, match: {{tenant: "*"}}, requests_per_min: 1000000}}]}}
slos:
  objectives:
    - {{route: chat, ttft_p95: 1s, tpot_p95: 200ms, availability: 99%}}
    - {{route: mixed, availability: 99%}}
breakers: {{consecutive_failures: 2, cool_down: 60s}}
state_dir: {tmp_path / "state"}
observability: {{access_log: "off"}}
""")
    targets = [{"targets": [host], "labels": {"pool": pool}} for pool, host in hosts.items()]
    targets.append({"targets": [dead], "labels": {"pool": "mixed"}})
    prometheus.start(
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(immediate_rules(tmp_path))],
            "scrape_configs": [
                {
                    "job_name": "kvgate",
                    "static_configs": [{"targets": [url.removeprefix("http://")]}],
                },
                {"job_name": "model-servers", "static_configs": targets},
            ],
        }
    )
    await load(url, 12.0)
    expected = {
        "KvgateCanaryRolledBack": {"route": "chat"},
        "KvgateBackendDown": {"instance": dead, "pool": "mixed"},
        "KvgateBreakerOpen": {"endpoint": dead},
        "KvgatePickerCannotScrape": {"endpoint": dead},
    }
    deadline = time.monotonic() + 30
    firing: dict[str, list[dict[str, str]]] = {}
    while time.monotonic() < deadline:
        firing = prometheus.firing()
        if all(
            any(labels.items() <= alert.items() for alert in firing.get(name, []))
            for name, labels in expected.items()
        ):
            break
        await load(url, 1.0)
    for name, labels in expected.items():
        assert any(labels.items() <= a.items() for a in firing.get(name, [])), (name, firing)
    # the healthy parts fire nothing
    quiet = {"KvgateErrorRateHigh", "KvgateBackendKVCacheFull", "KvgateLimiterStoreUnreachable"}
    assert not quiet & firing.keys(), firing
    await asyncio.sleep(2)  # a last scrape and rule evaluation
    empty: list[str] = []
    results: dict[str, list[dict[str, Any]]] = {}
    for panel, expr in dashboard_queries().items():
        results[panel] = prometheus.query(expr)
        if not results[panel]:
            empty.append(f"{panel}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)
    weights = {r["metric"]["pool"]: float(r["value"][1]) for r in
               results["kvgate-canary: Weight by pool"]}  # fmt: skip
    assert weights == {"stable": 100.0, "candidate": 0.0}
