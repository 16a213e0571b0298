"""The routing benchmark's report: per workload, each router's median over the rounds as a
Markdown table (with round robin's TTFT p90 ÷ its own), and TTFT p90 per stage of the ramp as
a plot."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from loadtest.reports import plots

BASELINE = "sglang-router round_robin"
COLUMNS = (
    ("TTFT p50 ms", "ttft_p50_ms", "{:.0f}"),
    ("TTFT p90 ms", "ttft_p90_ms", "{:.0f}"),
    ("TTFT p99 ms", "ttft_p99_ms", "{:.0f}"),
    ("output tok/s", "output_tokens_per_s", "{:.0f}"),
    ("hit rate", "hit_rate", "{:.0%}"),
    ("captured reuse", "captured_reuse", "{:.0%}"),
    ("min share", "min_share", "{:.2f}"),
    ("max share", "max_share", "{:.2f}"),
    ("CPU ms/req", "cpu_ms_per_request", "{:.2f}"),
    ("relay CPU ms/req", "relay_cpu_ms_per_request", "{:.1f}"),  # Dynamo's workers
    ("errors", "errors", "{:.0f}"),
    ("cold misses", "cold_misses", "{:.1%}"),  # kvgate only: warm endpoint passed over
    ("scrapes/req", "scrapes_per_request", "{:.1f}"),  # kvgate only: its /metrics polls
    # agentic workloads only
    ("2nd call TTFT p90 ms", "ttft_p90_second_call_ms", "{:.0f}"),
    ("later calls TTFT p90 ms", "ttft_p90_later_calls_ms", "{:.0f}"),
    ("live KV ÷ device", "live_kv_ratio", "{:.1f}"),
)

Results = dict[str, dict[str, list[dict[str, float]]]]


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rows) for key in rows[0]}


def report(results: Results) -> None:
    for workload, peers in results.items():
        table = {name: medians(rows) for name, rows in peers.items()}
        baseline = table.get(BASELINE, {})
        rounds = len(next(iter(peers.values())))
        floor = statistics.median(r.get("ttft_floor_p90_ms", math.nan) for r in table.values())
        best = f", RR p90 ÷ floor {baseline['ttft_p90_ms'] / floor:.1f}" if baseline else ""
        print(
            f"\n{workload} (median of {rounds} rounds; TTFT p90 floor {floor:.0f} ms{best}: each"
            " request alone on an idle engine holding all an ideal router could have cached)\n"
        )
        print(
            "| router | "
            + " | ".join(c for c, _, _ in COLUMNS)
            + " | RR p90 ÷ it | RR tok/s ÷ it |"
        )
        print("|---|" + "---:|" * (len(COLUMNS) + 2))
        for name, row in table.items():
            cells = [
                "—" if math.isnan(row.get(key, math.nan)) else fmt.format(row[key])
                for _, key, fmt in COLUMNS
            ]
            p90 = baseline.get("ttft_p90_ms")
            tokens = baseline.get("output_tokens_per_s")
            ratio = f"{p90 / row['ttft_p90_ms']:.1f}" if p90 else "—"
            throughput = f"{row['output_tokens_per_s'] / tokens:.2f}" if tokens else "—"
            print(f"| {name} | " + " | ".join(cells) + f" | {ratio} | {throughput} |")


def _first_row(peers: dict[str, list[dict[str, float]]]) -> dict[str, float]:
    return next(iter(peers.values()))[0] if peers else {}


def plot_stages(results: Results, rates: list[float], path: Path) -> Path | None:
    """TTFT p90 against each stage's offered rate, one line per router, a panel per workload
    that ran the ramp (the agentic ones run their own arrivals)."""
    results = {w: p for w, p in results.items() if "stage_1_ttft_p90_ms" in _first_row(p)}
    if not plots.available() or not results:
        return None
    plt = plots.pyplot()
    figure, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for axis, (workload, peers) in zip(axes[0], results.items(), strict=True):
        for name, rows in peers.items():
            row = medians(rows)
            axis.plot(
                rates, [row[f"stage_{i}_ttft_p90_ms"] for i in range(len(rates))], "o-", label=name
            )
        axis.set_title(workload)
        axis.set_xlabel("offered load (requests/s)")
        axis.set_ylabel("TTFT p90 (ms)")
        axis.set_yscale("log")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    return plots.save(figure, path)
