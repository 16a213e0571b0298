"""``kvgate epp --workers 2``: two picker processes share the gRPC and metrics
ports, a prefix placed by one worker is warm for the other, /metrics adds up both (the index
size is one index's: the workers share their picks), and a port that is taken stops the start
with one line."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc

from bench.envoy_messages import body_messages, headers_message
from epp.service import EppService
from kvgate.api.envoy import external_processor_pb2_grpc as ep_grpc
from loadtest.harness.processes import epp_process, free_port
from policies.loader import load_policy_text
from tests.integration.metrics_util import scrape

HEADERS = {":path": "/v1/chat/completions", ":method": "POST", "content-type": "application/json"}


def chat(prefix: str, question: int) -> dict[str, object]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": f"system prompt {prefix}. " * 200},
            {"role": "user", "content": f"question {question}"},
        ],
    }


def destination(target: str, prefix: str, question: int) -> str:
    """Where the picker sends one chat request, asked over a connection of its own (the
    kernel picks the worker for each new connection)."""
    body = json.dumps(chat(prefix, question)).encode()
    with grpc.insecure_channel(target) as channel:
        replies = list(
            ep_grpc.ExternalProcessorStub(channel).Process(  # type: ignore[no-untyped-call]
                iter([headers_message(HEADERS), *body_messages(body)]), timeout=10
            )
        )
    mutation = replies[0].request_headers.response.header_mutation
    found = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
    return str(found["x-gateway-destination-endpoint"])


def blocks_placed(policy: str) -> int:
    """The blocks one picker's index holds after the 32 picks: each prefix's questions land on
    one endpoint, so the union of their blocks per prefix."""
    service = EppService(load_policy_text(policy))
    assert service.prefix is not None
    total = 0
    for prefix in "abcdefgh":
        keys: set[int] = set()
        for question in range(4):
            request = service.scheduling_request("p", "", "m", chat(prefix, question), {})
            keys.update(service.prefix.keys(request))
        total += len(keys)
    return total


def worker_pids(supervisor: int) -> list[int]:
    """The supervisor's worker processes (not multiprocessing's resource tracker)."""
    workers = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
            command = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if f"\nPPid:\t{supervisor}\n" in text and b"spawn_main" in command:
            workers.append(int(status.parent.name))
    return workers


def test_two_workers_share_the_ports_and_the_affinity(tmp_path: Path) -> None:
    dead = free_port()  # loopback addresses nothing serves: the picker still ranks them
    endpoints = ", ".join(f"127.0.0.{i}:{dead}" for i in (2, 3, 4, 5))
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"pools: {{p: {{endpoints: [{endpoints}]}}}}\nroutes: [{{model: m, pool: p}}]\n"
    )
    grpc_port, metrics_port = free_port(), free_port()
    process = epp_process(str(policy), grpc_port, metrics_port)
    process.args += ["--workers", "2"]
    with process:
        assert process.proc is not None
        deadline = time.monotonic() + 20
        while len(worker_pids(process.proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(worker_pids(process.proc.pid)) == 2
        target = f"127.0.0.1:{grpc_port}"
        time.sleep(1.5)  # each worker has found the other's pick socket
        placed: dict[str, set[str]] = {}
        for prefix in "abcdefgh":
            for question in range(4):
                placed.setdefault(prefix, set()).add(destination(target, prefix, question))
                time.sleep(0.05)  # the pick reaches the other worker (a datagram)
        # every follow-up found its prefix warm, on whichever worker it reached
        assert all(len(where) == 1 for where in placed.values()), placed
        assert len(set().union(*placed.values())) > 1  # and the prefixes were spread
        decisions = scrape(f"http://127.0.0.1:{metrics_port}")["kvgate_epp_decisions_total"]
        assert sum(s.value for s in decisions) == 32  # both workers' picks, from either
        for _ in range(6):  # new connections: each worker is likely to serve one and set its
            blocks = scrape(f"http://127.0.0.1:{metrics_port}")["kvgate_epp_prefix_index_blocks"]
        # the workers' indexes hold the same blocks: the gauge is one index's, not their sum
        assert sum(s.value for s in blocks) == blocks_placed(policy.read_text())


def test_a_taken_port_stops_the_start_with_one_line(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("pools: {p: {endpoints: [127.0.0.2:1]}}\nroutes: [{model: m, pool: p}]\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", "kvgate", "epp", "--policy", str(policy), "--workers", "2"]
        argv += [
            "--host",
            "127.0.0.1",
            "--grpc-port",
            str(port),
            "--metrics-port",
            str(free_port()),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port} (--grpc-port)" in lines[0]
