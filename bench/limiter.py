"""How exactly two gateway replicas sharing Redis hold a limit while the box is busy
(``make bench-limiter``; docs/benchmarks.md, "Shared rate limits").

Two replicas (``replicas: 2``, ``fail_open``, the default 20 ms store timeout) in front of one
simulated backend share a requests-per-minute limit (one tenant) and a tokens-per-minute limit
(another), while CPU hogs spin on every core and closed-loop clients push far past both limits.
Each scenario starts from an empty Redis and fresh gateways; "outage" kills Redis part-way and
restarts it empty. A limit admits at most its burst (one minute's worth) plus its refill over the
run; the table shows what was admitted against that, as a ratio.

    python -m bench.limiter [--duration 20] [--outage 5] [--hogs 2] [--rounds 1]
        [--tree OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.pd_transfer import metric_sum
from loadtest.harness.processes import KvgateProcess, backend_process, free_port, gateway_process
from loadtest.harness.redis_server import RedisServer

# small enough that the clients empty each burst in the first seconds: from then on both limits
# are saturated, and what they admit is their refill
REQUESTS_PER_MIN = 300
TOKENS_PER_MIN = 15_000
PROMPT = "x" * 40  # 40 tokens with the simulated backend's byte tokenizer
MAX_TOKENS = 30  # the simulated backend generates exactly this many: 70 tokens a request
KEYS = {"by-requests": "kvgate-bench-requests-key", "by-tokens": "kvgate-bench-tokens-key"}


def policy(backend: str, redis_url: str, timeout: str = "20ms") -> str:
    keys = "\n".join(
        f"    - {{name: {t}, sha256: {hashlib.sha256(k.encode()).hexdigest()}, tenant: {t}}}"
        for t, k in KEYS.items()
    )
    return f"""
pools: {{p: {{endpoints: [{backend}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
observability: {{access_log: "off"}}
auth:
  api_keys:
{keys}
limits:
  store: {{kind: redis, url: "{redis_url}", timeout: {timeout}, on_failure: fail_open, replicas: 2}}
  chars_per_token: 1
  rules:
    - {{name: requests, match: {{tenant: by-requests}}, requests_per_min: {REQUESTS_PER_MIN}}}
    - {{name: tokens, match: {{tenant: by-tokens}}, tokens_per_min: {TOKENS_PER_MIN}}}
"""


@dataclass
class Tally:
    """What the clients of one tenant saw."""

    admitted: int = 0
    tokens: int = 0  # usage of the admitted requests, as the gateway settles it
    statuses: dict[int, int] = field(default_factory=dict)
    slowest: float = 0.0


@dataclass
class RunResult:
    elapsed: float
    tallies: dict[str, Tally]
    store_errors: float = 0.0  # the replicas' failed calls to Redis
    fallback_decisions: float = 0.0  # requests the replicas decided without Redis

    def allowed(self, per_min: int) -> float:
        """What a limit may admit over the run: its burst plus its refill."""
        return per_min + per_min / 60 * self.elapsed

    @property
    def request_ratio(self) -> float:
        return self.tallies["by-requests"].admitted / self.allowed(REQUESTS_PER_MIN)

    @property
    def token_ratio(self) -> float:
        return self.tallies["by-tokens"].tokens / self.allowed(TOKENS_PER_MIN)


async def drive(
    urls: list[str],
    duration: float,
    concurrency: int,
    redis: RedisServer,
    outage: tuple[float, float] | None = None,
) -> RunResult:
    """Closed-loop clients, half per tenant, spread over the replicas, for ``duration``
    seconds; with ``outage`` (start, length), Redis is killed then and restarted empty."""
    tallies = {tenant: Tally() for tenant in KEYS}
    body = {"model": "kvgate-sim", "prompt": PROMPT, "max_tokens": MAX_TOKENS}
    started = time.monotonic()
    stop_at = started + duration

    async def client(n: int, session: aiohttp.ClientSession) -> None:
        tenant = list(KEYS)[n % 2]
        url = f"{urls[(n // 2) % len(urls)]}/v1/completions"
        headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
        tally = tallies[tenant]
        while time.monotonic() < stop_at:
            sent = time.monotonic()
            async with session.post(url, json=body, headers=headers) as response:
                payload = await response.json(content_type=None)
            tally.slowest = max(tally.slowest, time.monotonic() - sent)
            tally.statuses[response.status] = tally.statuses.get(response.status, 0) + 1
            if response.status == 200:
                tally.admitted += 1
                tally.tokens += int(payload["usage"]["total_tokens"])
            elif response.status == 429:
                await asyncio.sleep(0.005)  # as a client would, briefly

    async def break_redis() -> None:
        assert outage is not None
        await asyncio.sleep(outage[0])
        redis.stop()
        await asyncio.sleep(outage[1])
        await asyncio.to_thread(redis.start)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [asyncio.create_task(client(n, session)) for n in range(concurrency)]
        if outage is not None:
            tasks.append(asyncio.create_task(break_redis()))
        await asyncio.gather(*tasks)
    return RunResult(time.monotonic() - started, tallies)


def counters(base_url: str) -> str:
    """A gateway's /metrics text."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as response:
        return str(response.read().decode())


def start_hogs(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


async def scenario(
    backend: str, outage: tuple[float, float] | None, args: argparse.Namespace, workdir: Path
) -> RunResult:
    redis = RedisServer(free_port()).start()
    path = workdir / "policy.yaml"
    path.write_text(policy(backend, redis.url, args.timeout))
    gateways: list[KvgateProcess] = []
    try:
        ports = [free_port() for _ in range(2)]
        gateways = [
            gateway_process(
                str(path), port, tree=args.tree, log=str(workdir / f"gw{port}.log")
            ).start()
            for port in ports
        ]
        hogs = start_hogs(args.hogs)
        try:
            urls = [f"http://127.0.0.1:{port}" for port in ports]
            result = await drive(urls, args.duration, args.concurrency, redis, outage)
            for url in urls:
                text = counters(url)
                result.store_errors += metric_sum(text, "kvgate_limiter_store_errors_total", {})
                result.fallback_decisions += metric_sum(
                    text, "kvgate_limiter_fallback_decisions_total", {}
                )
            return result
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
    finally:
        for gateway in gateways:
            gateway.stop()
        redis.stop()


def row(name: str, result: RunResult) -> str:
    req, tok = result.tallies["by-requests"], result.tallies["by-tokens"]
    return (
        f"| {name} | {result.elapsed:.1f} | {req.admitted} / {result.allowed(REQUESTS_PER_MIN):.0f}"
        f" | {result.request_ratio:.3f} | {tok.tokens} / {result.allowed(TOKENS_PER_MIN):.0f}"
        f" | {result.token_ratio:.3f} | {result.store_errors:.0f} | {result.fallback_decisions:.0f}"
        f" | {max(req.slowest, tok.slowest) * 1000:.0f} |"
    )


async def main_async(args: argparse.Namespace) -> None:
    outage = (max(0.0, (args.duration - args.outage) / 2), args.outage)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.logs or tmp
        port = free_port()
        with backend_process(port, "--cost", "zero"):
            print(
                f"two replicas, fail_open, {args.hogs} CPU hog(s), {args.concurrency} clients, "
                f"{args.duration:.0f} s a run; limits {REQUESTS_PER_MIN} requests/min and "
                f"{TOKENS_PER_MIN} tokens/min; outage: Redis killed for {args.outage:.0f} s\n"
            )
            print(
                "| scenario | s | requests admitted / allowed | ratio | tokens admitted / "
                "allowed | ratio | store errors | fallback decisions | slowest ms |"
            )
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
            for n in range(args.rounds):
                for name, cut in (("healthy", None), ("outage", outage)):
                    result = await scenario(f"127.0.0.1:{port}", cut, args, Path(tmp))
                    print(row(f"{name} (round {n + 1})", result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds a run (20)")
    parser.add_argument("--outage", type=float, default=5.0, help="seconds Redis is away (5)")
    parser.add_argument("--hogs", type=int, default=2, help="CPU-spinning processes (2)")
    parser.add_argument("--concurrency", type=int, default=24, help="closed-loop clients (24)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each scenario (1)")
    parser.add_argument("--logs", help="keep the gateways' logs in this folder")
    parser.add_argument("--timeout", default="20ms", help="the store's timeout (20ms)")
    parser.add_argument("--tree", help="run the gateways from this checkout (a baseline)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
