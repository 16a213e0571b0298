"""``--workers 2``: two processes share the port; /metrics sums over both (SLO events too, while
each worker's SLO gauges carry its pid); a taken port fails
fast; the metrics files go with a clean stop."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from loadtest.harness.processes import KvgateProcess, free_port
from tests.http_servers import serving
from tests.integration.metrics_util import scrape


async def test_two_workers_share_the_port_and_the_metrics(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    url, gateway = start_gateway(
        f"""
pools: {{p: {{endpoints: [{backend}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
slos: {{objectives: [{{route: kvgate-sim, availability: 99%}}]}}
""",
        "--workers",
        "2",
    )
    body = {"model": "kvgate-sim", "prompt": "w", "max_tokens": 1}

    async def one() -> int:
        # a fresh connection each time, so the kernel spreads them over both workers
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/v1/completions", json=body) as response,
        ):
            await response.read()
            return response.status

    statuses = await asyncio.gather(*(one() for _ in range(60)))
    assert statuses == [200] * 60
    total = 0.0
    for _ in range(40):  # a worker moves its batched samples into the shared files twice a second
        total = sum(
            s.value
            for s in scrape(url).get("kvgate_requests_total", [])
            if s.labels["route"] == "/v1/completions"
        )
        if total == 60:
            break
        await asyncio.sleep(0.1)
    assert total == 60
    # the SLO events add up over the workers; each worker's own burn rates say whose they are
    samples = scrape(url)
    events = sum(s.value for s in samples["kvgate_slo_events_total"] if s.labels["good"] == "true")
    assert events == 60
    pids = {s.labels.get("pid") for s in samples["kvgate_slo_burn_rate"]}
    assert pids and None not in pids
    children = await asyncio.create_subprocess_exec(
        "pgrep",
        "-P",
        str(gateway.proc.pid),  # type: ignore[union-attr]
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await children.communicate()
    assert len(out.split()) >= 2


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_taken_admin_port_fails_fast_in_one_line(tmp_path: Path, workers: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        admin_port = taken.getsockname()[1]
        policy = tmp_path / "policy.yaml"
        policy.write_text(f"""
listen: {{host: 127.0.0.1, port: {free_port()}, admin: {{port: {admin_port}, token: "{"t" * 20}"}}}}
pools: {{p: {{endpoints: ["127.0.0.1:9"]}}}}
routes: [{{model: m, pool: p}}]
""")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "kvgate",
                "gateway",
                "--policy",
                str(policy),
                "--workers",
                workers,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # no traceback, no restarted workers
    assert f"127.0.0.1:{admin_port} (listen.admin.port)" in lines[0]


def test_the_metrics_directory_goes_after_a_clean_stop(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # where the workers' metrics files are made
    backend = start_backend("--cost", "zero").removeprefix("http://")
    _, gateway = start_gateway(
        f"pools: {{p: {{endpoints: [{backend}]}}}}\nroutes: [{{model: kvgate-sim, pool: p}}]\n",
        "--workers",
        "2",
    )
    # the metrics files; the pick exchange's sockets too unless the path is too long for one
    made = {p.name.rsplit("-", 1)[0] for p in scratch.iterdir()}
    assert "kvgate-metrics" in made and made <= {"kvgate-metrics", "kvgate-picks"}
    gateway.stop()
    assert gateway.proc is not None and gateway.proc.returncode == 0
    assert list(scratch.iterdir()) == []


async def test_two_workers_keep_one_backend_per_prefix(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    """Each worker learns the other's picks (epp.requestcontrol.pick_exchange): a prefix placed by one is
    warm for the other, so every request of a prefix lands on the same backend."""
    backends = [start_backend("--cost", "zero") for _ in range(4)]
    listed = ", ".join(b.removeprefix("http://") for b in backends)
    url, gateway = start_gateway(
        f"""
pools: {{p: {{endpoints: [{listed}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
""",
        "--workers",
        "2",
    )
    # /healthz answers once one worker is up; a worker that starts later has missed the picks
    # made before it (they are not replayed), so wait for both
    await _until_both_listen(gateway)
    prefixes = [f"system prompt {n}: " + "lorem ipsum dolor sit amet " * 40 for n in range(6)]

    def counts() -> list[float]:
        return [
            sum(s.value for s in scrape(b).get("vllm:request_success_total", [])) for b in backends
        ]

    async def one(session_prefix: str, n: int) -> str:
        """The backend that served the request (whose success count grew)."""
        body = {"model": "kvgate-sim", "prompt": f"{session_prefix} question {n}", "max_tokens": 1}
        before = counts()
        # a fresh connection each time, so the kernel spreads them over both workers
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/v1/completions", json=body) as response,
        ):
            await response.read()
            assert response.status == 200
        grew = [b for b, old, new in zip(backends, before, counts(), strict=True) if new > old]
        assert len(grew) == 1
        return grew[0]

    served: dict[int, set[str]] = {n: set() for n in range(len(prefixes))}
    for n in range(6):
        for p, prefix in enumerate(prefixes):
            served[p].add(await one(prefix, n))
    assert all(len(where) == 1 for where in served.values()), served


async def test_two_workers_scrape_an_endpoint_about_as_often_as_one(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    """Each worker's scrapes reach the other, which skips its own while they come: an idle
    endpoint polled every 100 ms is scraped about 10 times a second, not 20."""
    scrapes = [0]

    async def metrics(request: web.Request) -> web.Response:
        scrapes[0] += 1
        return web.Response(text='vllm:num_requests_running{model_name="m"} 0.0\n')

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with serving(app) as port:
        _, gateway = start_gateway(
            f"""
pools: {{p: {{endpoints: [127.0.0.1:{port}]}}}}
routes: [{{model: m, pool: p}}]
epp: {{scrape_idle_interval: 100ms, scrape_quiet_interval: 100ms}}
""",
            "--workers",
            "2",
        )
        await _until_both_listen(gateway)
        await asyncio.sleep(1.0)  # the workers find each other's sockets
        scrapes[0] = 0
        await asyncio.sleep(3.0)
    assert 20 <= scrapes[0] <= 42, scrapes  # one worker's 30 or so; both alone would make 60


async def _until_both_listen(gateway: KvgateProcess) -> None:
    for _ in range(200):
        if _listening(str(gateway.log)) == 2:
            return
        await asyncio.sleep(0.05)


def _listening(log: str) -> int:
    """How many workers have said they listen, in a gateway's log."""
    return Path(log).read_text().count("listening on")
