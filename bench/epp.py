"""Endpoint-picker latency and throughput: `make bench-epp`.

In-process: ``EppService.pick`` (the embedded default: parse, hash, score, pick, learn) for 8,
64 and 256 endpoints and 1k / 8k / 32k-token chat prompts, against an index warmed with many
prefixes. Over ext_proc: a ``kvgate epp`` process driven by a gRPC client the way Envoy drives
it (headers, the body in 62,000-byte chunks, then the replies), one stream per request; the
round trip includes the Python client's own gRPC cost. The same client first drives a
do-nothing ext_proc server with the same gRPC settings (``bench.null_ext_proc``): its round
trip is the floor of a Python gRPC ext_proc hop, and round trip minus floor is what the EPP's
own work adds. Both servers run side by side and are measured in turn, round after round (the
order alternating), so each ratio compares two measurements taken moments apart. Picks/s: 16
concurrent streams for a few seconds; server CPU per stream from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench.envoy_messages import body_messages, headers_message
from bench.metrics_parse import compare as compare_parsers
from bench.scrape_cost import main as print_scrape_costs
from epp.framework import SchedulingRequest
from epp.service import EppService
from kvgate.api.envoy import external_processor_pb2 as ep
from kvgate.api.envoy import external_processor_pb2_grpc as ep_grpc
from loadtest.harness.proc_stats import cpu_seconds
from loadtest.harness.processes import epp_process, free_port
from loadtest.reports.stats import percentile
from loadtest.workloads.shared_prefix import chat
from policies.loader import load_policy_text

REQUEST_HEADERS = {
    ":path": "/v1/chat/completions",
    ":method": "POST",
    "content-type": "application/json",
}


def policy_text(endpoints: int) -> str:
    # loopback addresses that nothing serves: the benchmark measures the picker, not a scrape
    addresses = ", ".join(f"127.0.1.{i // 250 + 1}:{10000 + i}" for i in range(endpoints))
    return f"pools: {{p: {{endpoints: [{addresses}]}}}}\nroutes: [{{model: m, pool: p}}]\n"


def pick_and_accept(service: EppService, request: SchedulingRequest) -> None:
    """One decision, taken by its endpoint (as the embedded picker's first attempt is)."""
    target = service.pick("p", request).result.target
    if target is not None:
        service.dispatched(request, target)


def timed_picks(service: EppService, tokens: int, picks: int) -> list[float]:
    """Seconds each of ``picks`` picks of pool ``p`` took (``pick_and_accept``), chat prompts
    of ``tokens`` tokens over 50 shared system prompts, after 100 that warm the index."""
    bodies = [chat(tokens, seed) for seed in range(200)]
    for i, body in enumerate(bodies[:100]):
        pick_and_accept(service, service.scheduling_request("p", f"w{i}", "m", body, {}))
    times = []
    for i in range(picks):
        body = bodies[i % len(bodies)]
        started = time.perf_counter()
        pick_and_accept(service, service.scheduling_request("p", f"r{i}", "m", body, {}))
        times.append(time.perf_counter() - started)
    return times


def in_process(endpoints: int, tokens: int, picks: int) -> tuple[float, float, float]:
    service = EppService(load_policy_text(policy_text(endpoints)))
    now = time.monotonic()
    for endpoint in service.datastore.all():
        endpoint.metrics.scraped_at = now + 3600  # fresh for the whole run
    times = [t * 1000 for t in timed_picks(service, tokens, picks)]
    return percentile(times, 50), percentile(times, 99), 1000 / statistics.fmean(times)


def envoy_messages(body: bytes) -> list[ep.ProcessingRequest]:
    return [headers_message(REQUEST_HEADERS), *body_messages(body)]


async def over_ext_proc(
    target: str, tokens: int, requests: int, seconds: float, connections: int = 1
) -> tuple[float, float, float, int]:
    """Round trip p50 and p99 (ms) of ``requests`` sequential streams, streams/s with 16 at a
    time for ``seconds`` (over ``connections`` channels, in turn), and how many streams were
    sent in all."""
    bodies = [json.dumps(chat(tokens, seed)).encode() for seed in range(100)]
    options = [
        ("grpc.max_receive_message_length", 64 << 20),
        ("grpc.max_send_message_length", 64 << 20),
        ("grpc.use_local_subchannel_pool", 1),  # a connection each, not one shared
    ]
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(connections)]
    try:
        stubs = [ep_grpc.ExternalProcessorStub(channel) for channel in channels]  # type: ignore[no-untyped-call]

        async def one(i: int) -> float:
            messages = envoy_messages(bodies[i % len(bodies)])
            started = time.perf_counter()
            async for _ in stubs[i % len(stubs)].Process(iter(messages)):
                pass
            return (time.perf_counter() - started) * 1000

        for i in range(20):
            await one(i)  # warm-up
        latencies = [await one(i) for i in range(requests)]
        done, deadline = 0, time.perf_counter() + seconds

        async def worker(w: int) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await one(done + w)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(16)))
        rate = done / (time.perf_counter() - started)
    finally:
        for channel in channels:
            await channel.close()
    return percentile(latencies, 50), percentile(latencies, 99), rate, 20 + requests + done


@dataclass
class ExtProcRow:
    p50: float
    p99: float
    rate: float
    cpu_ms: float  # server CPU per stream


def measure(
    target: str, pid: int, tokens: int, requests: int, seconds: float, connections: int = 1
) -> ExtProcRow:
    """One server at one prompt size; its CPU is that of ``pid`` and its children."""
    before = cpu_seconds(pid)
    p50, p99, rate, streams = asyncio.run(
        over_ext_proc(target, tokens, requests, seconds, connections)
    )
    return ExtProcRow(p50, p99, rate, (cpu_seconds(pid) - before) / streams * 1000)


def wait_grpc(target: str, timeout: float = 20.0) -> None:
    with grpc.insecure_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=timeout)


@contextmanager
def null_ext_proc() -> Iterator[tuple[str, int]]:
    """The do-nothing ext_proc server: its target and pid."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.null_ext_proc", str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_grpc(f"127.0.0.1:{port}")
        yield f"127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


@dataclass
class Paired:
    """One prompt size: the EPP's and the floor's rows of each round, measured back to back."""

    epp: list[ExtProcRow]
    floor: list[ExtProcRow]

    def median(self, value: Callable[[ExtProcRow, ExtProcRow], float]) -> float:
        return statistics.median(value(e, f) for e, f in zip(self.epp, self.floor, strict=True))


def interleaved(
    epp: tuple[str, int],
    floor: tuple[str, int],
    tokens: int,
    requests: int,
    seconds: float,
    rounds: int,
) -> Paired:
    """``rounds`` rounds, each measuring both servers in turn (the order alternates, so a drift
    of the machine's load favours neither): ratios are taken within a round."""
    paired = Paired([], [])
    for n in range(rounds):
        order = [("epp", epp), ("floor", floor)]
        for name, (target, pid) in order if n % 2 == 0 else reversed(order):
            row = measure(target, pid, tokens, requests, seconds)
            (paired.epp if name == "epp" else paired.floor).append(row)
    return paired


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--picks", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=300, help="sequential ext_proc requests")
    parser.add_argument("--seconds", type=float, default=3.0, help="ext_proc throughput run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved ext_proc rounds")
    args = parser.parse_args()
    print("## In-process pick (approximate prefix mode, default profile)\n")
    print("| endpoints | prompt tokens | p50 ms | p99 ms | picks/s |")
    print("|---:|---:|---:|---:|---:|")
    for endpoints in (8, 64, 256):
        for tokens in (1_000, 8_000, 32_000):
            p50, p99, rate = in_process(endpoints, tokens, args.picks)
            print(f"| {endpoints} | {tokens:,} | {p50:.3f} | {p99:.3f} | {rate:,.0f} |")
    ours, full, lines = compare_parsers()
    print("\n## Metrics parse per scrape (vLLM-like text, 2 engines)\n")
    print("| lines | picker's parser µs | prometheus_client µs | ratio |")
    print("|---:|---:|---:|---:|")
    print(f"| {lines} | {ours:.1f} | {full:.1f} | {full / ours:.1f}x |")
    print("\n## A scrape of a reference backend, whole and filtered (`?name[]=...`)\n")
    print_scrape_costs()
    sizes = (1_000, 8_000, 32_000)
    print(
        f"\n## Over ext_proc (one gRPC stream per request, loopback, Python client; "
        f"{args.rounds} rounds, the EPP and the do-nothing floor back to back in each; "
        "medians, ratios taken within a round)\n"
    )
    print(
        "| endpoints | prompt tokens | round trip p50 ms | floor p50 ms | added p50 ms "
        "| added p99 ms | streams/s (16 at a time) | floor streams/s | ÷ floor "
        "| CPU ms/stream | floor CPU ms | ÷ floor |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    directory = Path(tempfile.mkdtemp(prefix="kvgate-bench-epp-"))
    with null_ext_proc() as floor:
        for endpoints in (8, 64, 256):
            policy = directory / f"epp-{endpoints}.yaml"
            policy.write_text(policy_text(endpoints))
            grpc_port, metrics_port = free_port(), free_port()
            with epp_process(str(policy), grpc_port, metrics_port) as process:
                assert process.proc is not None
                epp = (f"127.0.0.1:{grpc_port}", process.proc.pid)
                for tokens in sizes:
                    pair = interleaved(epp, floor, tokens, args.requests, args.seconds, args.rounds)
                    print(
                        f"| {endpoints} | {tokens:,} | {pair.median(lambda e, f: e.p50):.2f} "
                        f"| {pair.median(lambda e, f: f.p50):.2f} "
                        f"| {pair.median(lambda e, f: e.p50 - f.p50):+.2f} "
                        f"| {pair.median(lambda e, f: e.p99 - f.p99):+.2f} "
                        f"| {pair.median(lambda e, f: e.rate):,.0f} "
                        f"| {pair.median(lambda e, f: f.rate):,.0f} "
                        f"| {pair.median(lambda e, f: e.rate / f.rate):.2f} "
                        f"| {pair.median(lambda e, f: e.cpu_ms):.2f} "
                        f"| {pair.median(lambda e, f: f.cpu_ms):.2f} "
                        f"| {pair.median(lambda e, f: e.cpu_ms / f.cpu_ms):.2f} |",
                        flush=True,
                    )
    workers_rows(directory, args)
    return 0


def workers_rows(directory: Path, args: argparse.Namespace) -> None:
    """``kvgate epp`` with 1 and with 2 workers, in interleaved rounds: 8 endpoints, 1k-token
    prompts, 16 streams at a time over 4 connections (the kernel gives each connection to a
    worker)."""
    policy = directory / "epp-workers.yaml"
    policy.write_text(policy_text(8))
    print(
        f"\n## `kvgate epp --workers N` (8 endpoints, 1,000-token prompts, 16 streams over 4 "
        f"connections; {args.rounds} interleaved rounds, medians)\n"
    )
    print("| workers | streams/s | ÷ 1 worker | CPU ms/stream (all workers) | round trip p50 ms |")
    print("|---:|---:|---:|---:|---:|")
    servers = []
    with contextlib.ExitStack() as stack:
        for workers in (1, 2):
            grpc_port, metrics_port = free_port(), free_port()
            process = epp_process(str(policy), grpc_port, metrics_port)
            process.args += ["--workers", str(workers)]
            stack.enter_context(process)
            assert process.proc is not None
            servers.append((f"127.0.0.1:{grpc_port}", process.proc.pid))
        time.sleep(2)  # the second worker of the 2-worker picker is up too
        rows: list[list[ExtProcRow]] = [[], []]
        for n in range(args.rounds):
            for i in (0, 1) if n % 2 == 0 else (1, 0):
                target, pid = servers[i]
                rows[i].append(measure(target, pid, 1_000, 50, args.seconds, connections=4))
    ratios = [two.rate / one.rate for one, two in zip(rows[0], rows[1], strict=True)]
    for workers, measured in ((1, rows[0]), (2, rows[1])):
        ratio = 1.0 if workers == 1 else statistics.median(ratios)
        print(
            f"| {workers} | {statistics.median(r.rate for r in measured):,.0f} | {ratio:.2f} "
            f"| {statistics.median(r.cpu_ms for r in measured):.2f} "
            f"| {statistics.median(r.p50 for r in measured):.2f} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
