"""The cost of the full policy chain, side by side in one run: `make bench-policy`.

The same non-streaming load through kvgate (one worker, two mock upstreams) with (a) a bare
policy, (b) the full chain — API-key auth, two rate-limit rules (per tenant and per model, high
enough never to refuse), the priority queue and a canary route — with limits in memory, and
(c) the same chain with limits in a local redis-server. Reported: p50 at one request at a time
(the chain's own latency, no queueing) and at 32, requests/s and CPU per request.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loadtest.client.http_load import run_wrk
from loadtest.harness.proc_stats import cpu_seconds
from loadtest.harness.processes import external_process, free_port, gateway_process
from loadtest.workloads.fixed import CHAT

KEY = "sk-bench-policy-chain"


def policy(ups: list[int], port: int, limits: str) -> str:
    endpoints = ", ".join(f"127.0.0.1:{p}" for p in ups)
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    store = "{kind: memory}"
    if limits not in ("none", "memory"):
        store = f"{{kind: redis, url: 'redis://127.0.0.1:{limits}/0', timeout: 100ms}}"
    chain = (
        ""
        if limits == "none"
        else f"""
auth: {{api_keys: [{{sha256: {digest}, tenant: acme, class: interactive}}]}}
limits:
  store: {store}
  rules:
    - {{name: tenant, match: {{tenant: "*"}}, requests_per_min: 100000000}}
    - {{name: model, match: {{model: mock}}, tokens_per_min: 10000000000}}
"""
    )
    route = (
        "{model: mock, pool: mocks}"
        if limits == "none"
        else "{model: mock, canary: [{pool: mocks, weight: 99}, {pool: mocks2, weight: 1}]}"
    )
    return f"""
listen: {{host: 127.0.0.1, port: {port}}}
pools: {{mocks: {{endpoints: [{endpoints}]}}, mocks2: {{endpoints: [{endpoints}]}}}}
routes: [{route}]
observability: {{access_log: "off"}}
epp: {{picker: least-in-flight}}
{chain}"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=6)
    args = parser.parse_args()
    if not shutil.which("wrk") or not shutil.which("redis-server"):
        print("needs wrk and redis-server (make bench-policy installs them)", file=sys.stderr)
        return 2
    directory = Path(tempfile.mkdtemp(prefix="kvgate-bench-policy-"))
    ups, redis_port = [free_port(), free_port()], free_port()
    mock = [sys.executable, "-m", "bench.mock_upstream", "--port"]
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    rows = []
    try:
        with (
            external_process([*mock, str(ups[0])], f"http://127.0.0.1:{ups[0]}/health"),
            external_process([*mock, str(ups[1])], f"http://127.0.0.1:{ups[1]}/health"),
        ):
            time.sleep(0.3)
            for name, limits in (
                ("bare proxy", "none"),
                ("policy chain, limits in memory", "memory"),
                ("policy chain, limits in Redis", str(redis_port)),
            ):
                port = free_port()
                file = directory / f"{limits}.yaml"
                file.write_text(policy(ups, port, limits))
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                headers = {} if limits == "none" else {"Authorization": f"Bearer {KEY}"}
                with gateway_process(str(file), port) as gateway:
                    assert gateway.proc is not None
                    run_wrk(url, CHAT, 8, 2, headers)  # warm-up
                    idle = run_wrk(url, CHAT, 1, args.seconds, headers)
                    before = cpu_seconds(gateway.proc.pid)
                    busy = run_wrk(url, CHAT, 32, args.seconds, headers)
                    cpu = (cpu_seconds(gateway.proc.pid) - before) / max(busy.requests, 1) * 1000
                rows.append((name, idle, busy, cpu))
    finally:
        redis.kill()
    bare = rows[0][1].p50_ms
    print("| kvgate | c1 p50 ms | added c1 p50 ms | c32 req/s | c32 p50 ms | CPU ms/req | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, idle, busy, cpu in rows:
        print(
            f"| {name} | {idle.p50_ms:.3f} | {idle.p50_ms - bare:+.3f} | {busy.rps:,.0f} | "
            f"{busy.p50_ms:.2f} | {cpu:.3f} | {idle.errors + busy.errors} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
