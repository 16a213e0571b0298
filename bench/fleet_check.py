"""``python -m bench.fleet --check``: the fleet simulator against the real benchmarks at the
sizes this machine runs, on the same trace windows.

Runs ``bench.routing`` (6 backends, one kvgate gateway, default and precise profiles; medians
of its rounds) and ``bench.replicas`` (6 backends, K = 1 and 3 gateways behind Envoy, sharing
through Redis; rounds pooled) as they run on their own, reads the JSON each writes, then
simulates each setup on the same windows (the same requests, engines, cache sizes and cost
model) and prints both side by side with their ratio. The goal is TTFT p90 and captured reuse
within 15% of reality.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from bench.fleet import FleetRun, row, simulate

ROOT = Path(__file__).resolve().parents[1]
ROUTING = {"kvgate (default profile)": False, "kvgate (precise, KV events)": True}
REPLICAS = {
    "K=1 approximate": (1, False),
    "K=3 approximate, shared": (3, False),
    "K=1 precise": (1, True),
    "K=3 precise, shared": (3, True),
}
TOLERANCE = 0.15


def _run(module: str, *args: str) -> dict[str, object]:
    command = [sys.executable, "-m", module, "--workload", "trace", *args]
    print("$ " + " ".join(command[1:]), flush=True)
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    name = module.rsplit(".", 1)[1]
    results: dict[str, object] = json.loads((ROOT / "build" / f"bench-{name}.json").read_text())
    return results


def _line(setup: str, figure: str, real: float, simulated: float, percent: bool) -> str:
    ratio = simulated / real if real else float("nan")
    shown = (f"{real:.1%}", f"{simulated:.1%}") if percent else (f"{real:.0f}", f"{simulated:.0f}")
    verdict = "within" if abs(ratio - 1) <= TOLERANCE else "outside"
    return f"| {setup} | {figure} | {shown[0]} | {shown[1]} | {ratio:.2f} ({verdict} 15%) |"


def check(rounds: int) -> int:
    lines = []
    routing = _run(
        "bench.routing",
        "--backends",
        "6",
        "--rounds",
        str(rounds),
        *(a for name in ROUTING for a in ("--peer", name)),
    )["trace"]
    for name, precise in ROUTING.items():
        rows = routing[name]  # type: ignore[index]
        outcomes = [simulate(FleetRun(6, 1, precise=precise, seed=n)) for n in range(rounds)]
        simulated = [row([o]) for o in outcomes]
        for figure, key, percent in (
            ("TTFT p90 ms", "ttft_p90_ms", False),
            ("captured reuse", "captured_reuse", True),
        ):
            real = statistics.median(r[key] for r in rows)
            sim = statistics.median(r[key] for r in simulated)
            lines.append(_line(f"bench-routing, {name}", figure, real, sim, percent))
    replicas = _run(
        "bench.replicas",
        "--backends",
        "6",
        "--rounds",
        str(rounds),
        *(a for name in REPLICAS for a in ("--setup", name)),
    )["trace"]
    base = FleetRun(6, 1, requests=256, speedup=8.0)
    for name, (k, precise) in REPLICAS.items():
        real_row = replicas[name]  # type: ignore[index]
        run = replace(base, replicas=k, precise=precise)
        pooled = row([simulate(replace(run, seed=n)) for n in range(rounds)])
        for figure, key, percent in (
            ("TTFT p90 ms", "ttft_p90_ms", False),
            ("captured reuse", "captured_reuse", True),
        ):
            lines.append(
                _line(f"bench-replicas, {name}", figure, real_row[key], pooled[key], percent)
            )
    print("\n## The simulator against reality (trace)\n")
    print("| setup | figure | real | simulated | simulated ÷ real |\n|---|---|---:|---:|---|")
    print("\n".join(lines))
    return 0
