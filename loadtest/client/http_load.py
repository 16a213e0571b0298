"""Closed-loop HTTP load on loopback: wrk when installed (C, cheap), else an aiohttp client.

Both send the same JSON body ``concurrency`` times in parallel for ``duration`` seconds and
report requests/s and latency percentiles of whole responses (streams read to their end).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from loadtest.reports.stats import percentile


@dataclass(frozen=True)
class LoadResult:
    tool: str
    concurrency: int
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if not match:
        raise ValueError(f"unexpected wrk latency {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def run_wrk(
    url: str,
    body: dict[str, object],
    concurrency: int,
    duration: float,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    script = (
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(json.dumps(body))}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    for name, value in (headers or {}).items():
        script += f"wrk.headers[{json.dumps(name)}] = {json.dumps(value)}\n"
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(script)
    try:
        out = subprocess.run(
            [
                "wrk",
                "-t1",
                f"-c{concurrency}",
                f"-d{max(1, round(duration))}s",
                "--latency",
                "-s",
                handle.name,
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=duration + 30,
        ).stdout
    finally:
        Path(handle.name).unlink()
    requests = int(re.search(r"(\d+) requests in ([\d.]+)(\w+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out
    )
    num_errors = int(errors.group(1)) if errors else 0
    if socket_errors:
        num_errors += sum(int(g) for g in socket_errors.groups())
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    return LoadResult(
        "wrk",
        concurrency,
        requests,
        num_errors,
        duration,
        _ms(p50.group(1)) if p50 else float("nan"),
        _ms(p99.group(1)) if p99 else float("nan"),
    )


async def _python_load(
    url: str, body: dict[str, object], concurrency: int, duration: float
) -> LoadResult:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + duration
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                async with session.post(url, json=body) as response:
                    await response.read()
                    if response.status != 200:
                        errors += 1
                latencies.append((time.perf_counter() - start) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return LoadResult(
        "aiohttp",
        concurrency,
        len(latencies),
        errors,
        elapsed,
        percentile(latencies, 50),
        percentile(latencies, 99),
    )


def run_load(url: str, body: dict[str, object], concurrency: int, duration: float) -> LoadResult:
    """wrk if it is on PATH, else the (slower, CPU-hungrier) aiohttp client."""
    if shutil.which("wrk"):
        return run_wrk(url, body, concurrency, duration)
    return asyncio.run(_python_load(url, body, concurrency, duration))


@dataclass(frozen=True)
class StreamLoadResult:
    requests: int
    errors: int
    seconds: float
    ttfc_p50_ms: float  # time to the first body chunk
    ttfc_p99_ms: float
    full_p50_ms: float
    full_p99_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


async def _stream_load(
    url: str,
    body: dict[str, object],
    concurrency: int,
    total: int,
    max_seconds: float,
    tls: ssl.SSLContext | None,
) -> StreamLoadResult:
    ttfc: list[float] = []
    full: list[float] = []
    errors = 0
    remaining = total
    deadline = time.perf_counter() + max_seconds
    payload = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=True if tls is None else tls)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal remaining, errors
            while remaining > 0 and time.perf_counter() < deadline:
                remaining -= 1
                start = time.perf_counter()
                first = 0.0
                tail = b""
                async with session.post(url, data=payload, headers=headers) as response:
                    async for chunk in response.content.iter_any():
                        if not first:
                            first = time.perf_counter()
                        tail = (tail + chunk)[-32:]
                    ok = response.status == 200 and b"[DONE]" in tail
                end = time.perf_counter()
                if not ok:
                    errors += 1
                    continue
                ttfc.append((first - start) * 1000)
                full.append((end - start) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return StreamLoadResult(
        len(full),
        errors,
        elapsed,
        percentile(ttfc, 50),
        percentile(ttfc, 99),
        percentile(full, 50),
        percentile(full, 99),
    )


def run_stream_load(
    url: str,
    body: dict[str, object],
    concurrency: int = 32,
    total: int = 2000,
    max_seconds: float = 60.0,
    tls: ssl.SSLContext | None = None,
) -> StreamLoadResult:
    """Streamed requests from an aiohttp client: time to first chunk and to ``[DONE]``;
    ``tls``: how an ``https://`` server is verified (default: the system's CAs)."""
    return asyncio.run(_stream_load(url, body, concurrency, total, max_seconds, tls))
