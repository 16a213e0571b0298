"""`python -m bench.capacity`: how a pool of mixed hardware splits its requests, with and
without capacity weights.

Two simulated backends whose cost models differ 3x (``FAST`` and ``SLOW``: every cost of one
three times the other's), one gateway on the default profile, the fast endpoint listed with
``capacity: 1`` (no weights) or ``capacity: 3``, or the pool's ``capacity: measured`` (the
picker reads each engine's decode speed); ``kvgate loadtest`` sends ``--requests``
streamed chats of a workload (random prompts: each a new prefix; or shared prefixes) at each
``--rate``. The split is read from each backend's own ``vllm:request_success_total``. The
setups are interleaved over ``--rounds``; the table gives each round's fast : slow ratio and
the TTFT p90 (and, measured, the capacity the picker ended with for the fast endpoint).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from loadtest.harness.processes import backend_process, free_port, gateway_process

FAST = "0.004,0.00005,0.0001,0.0000001"
SLOW = "0.012,0.00015,0.0003,0.0000003"
WORKLOADS = {
    "random": ["--workload", "random", "--input-tokens", "200"],
    "shared-prefix": ["--workload", "shared-prefix", "--groups", "24"],
}


def samples(url: str, name: str) -> list[Sample]:
    """The samples of series ``name`` on ``url``'s /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    families = text_string_to_metric_families(text)
    return [s for family in families for s in family.samples if s.name == name]


def served(url: str) -> float:
    return sum(s.value for s in samples(url, "vllm:request_success_total"))


def measured(url: str, port: int) -> float:
    """The capacity the gateway's picker gives the endpoint on ``port``, relative to the other."""
    values = {s.labels["endpoint"]: s.value for s in samples(url, "kvgate_epp_endpoint_capacity")}
    mine = values.get(f"127.0.0.1:{port}", 1.0)
    others = [v for address, v in values.items() if address != f"127.0.0.1:{port}"]
    return mine / max(others[0] if others else 1.0, 1e-9)


def one_run(
    capacity: str, rate: float, args: argparse.Namespace, work: Path
) -> tuple[float, float, float]:
    """(fast : slow requests, TTFT p90 ms, fast : slow capacity at the end) of one run on
    fresh processes."""
    ports = [free_port(), free_port()]
    backends = [
        backend_process(port, "--cost", cost, "--num-blocks", str(args.num_blocks),
                        "--max-model-len", "4096")
        for port, cost in zip(ports, (FAST, SLOW), strict=True)
    ]  # fmt: skip
    policy = work / "policy.yaml"
    fast = f"127.0.0.1:{ports[0]}"
    if capacity != "measured":
        fast = f"{{address: {fast}, capacity: {capacity}}}"
    policy.write_text(
        f"pools: {{p: {{capacity: {'measured' if capacity == 'measured' else 'configured'}, "
        f"endpoints: [{fast}, 127.0.0.1:{ports[1]}]}}}}\n"
        "routes: [{model: kvgate-sim, pool: p}]\n"
    )
    gateway_port = free_port()
    out = work / f"run-{capacity}-{rate}"
    with backends[0], backends[1], gateway_process(str(policy), gateway_port):
        subprocess.run(
            [sys.executable, "-m", "kvgate", "loadtest", "--url",
             f"http://127.0.0.1:{gateway_port}", *WORKLOADS[args.workload],
             "--output-tokens", str(args.output_tokens), "--rate", str(rate),
             "--num-requests", str(args.requests), "--no-plots", "--no-progress",
             "--out", str(out)],
            check=True, capture_output=True,
        )  # fmt: skip
        requests = [served(f"http://127.0.0.1:{port}") for port in ports]
        weight = measured(f"http://127.0.0.1:{gateway_port}", ports[0])
    results = json.loads((out / "results.json").read_text())
    return requests[0] / max(requests[1], 1.0), float(results["p90_ttft_ms"]), weight


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, action="append", help="requests/s (repeat)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--num-blocks", type=int, default=4096)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="random")
    parser.add_argument(
        "--capacity", action="append", help="1, 3 or measured (repeat; default: all three)"
    )
    args = parser.parse_args()
    rates = args.rate or [4.0, 16.0]
    rows: dict[tuple[float, str], list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for rate in rates:
                for capacity in args.capacity or ["1", "3", "measured"]:
                    rows.setdefault((rate, capacity), []).append(
                        one_run(capacity, rate, args, Path(tmp))
                    )
    print(
        "| rate (req/s) | fast endpoint's capacity | fast : slow, per round | TTFT p90 ms "
        "| capacity at the end |"
    )
    print("|---|---|---|---|---|")
    for (rate, capacity), runs in rows.items():
        ratios = " / ".join(f"{ratio:.2f}" for ratio, _, _ in runs)
        ttfts = " / ".join(f"{ttft:.0f}" for _, ttft, _ in runs)
        weights = " / ".join(f"{weight:.2f}" for _, _, weight in runs)
        print(f"| {rate:g} | {capacity} | {ratios} | {ttfts} | {weights} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
