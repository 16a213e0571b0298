"""`make bench-overload`'s figures: one row per router and run from the client's records and,
for kvgate, its /metrics; a Markdown table per workload."""

from __future__ import annotations

import math
import statistics

from prometheus_client.parser import text_string_to_metric_families

from loadtest.reports.records import RequestRecord
from loadtest.reports.stats import percentile

# each class's TTFT objective, seconds: a request that met it counts in the goodput
OBJECTIVES = {"interactive": 1.0, "standard": 4.0, "batch": 60.0}
COLUMNS = (
    ("interactive TTFT p50 / p99 ms", "interactive_ttft_p50_ms", "interactive_ttft_p99_ms"),
    ("standard TTFT p50 / p99 ms", "standard_ttft_p50_ms", "standard_ttft_p99_ms"),
    ("batch TTFT p50 / p99 ms", "batch_ttft_p50_ms", "batch_ttft_p99_ms"),
)


def row_of(
    raw: dict[str, object],
    digests: dict[int, str],
    seconds: float,
    floor: dict[str, float] | None = None,
) -> dict[str, float]:
    """A run's figures: per class TTFT p50/p99 (ms) and failures; goodput (requests within their
    class's objective per second of ``seconds``); batch answers unlike the unpaused ones
    (``digests``); and from kvgate's metrics, pauses, early refusals and the latency model's
    error. ``floor``: the unloaded run's row, for the interactive p99's ratio to it."""
    records = [RequestRecord.from_dict(r) for r in raw["records"]]  # type: ignore[attr-defined]
    row: dict[str, float] = {}
    good = 0
    for name, objective in OBJECTIVES.items():
        mine = [r for r in records if r.group.startswith(f"{name}|")]
        ttfts = [r.ttft * 1000 for r in mine if r.ok]
        row[f"{name}_ttft_p50_ms"] = percentile(ttfts, 50)
        row[f"{name}_ttft_p99_ms"] = percentile(ttfts, 99)
        row[f"{name}_failed"] = float(sum(1 for r in mine if not r.ok))
        good += sum(1 for r in mine if r.ok and r.ttft <= objective)
    row["goodput_per_s"] = good / seconds
    batch = [r for r in records if r.group.startswith("batch|") and r.ok]
    compared = [r for r in batch if r.index in digests]
    row["batch_answers_compared"] = float(len(compared))
    row["batch_answers_changed"] = float(sum(1 for r in compared if digests[r.index] != r.digest))
    if floor is not None:
        row["interactive_p99_vs_unloaded"] = (
            row["interactive_ttft_p99_ms"] / floor["interactive_ttft_p99_ms"]
        )
    row.update(_kvgate_counts(str(raw.get("metrics") or "")))
    return row


def _kvgate_counts(text: str) -> dict[str, float]:
    """Pauses, early refusals (deadline) and the latency model's p50/p90 relative error, from
    kvgate's /metrics (NaN for a peer)."""
    if not text:
        return {
            k: math.nan for k in ("pauses", "deadline_refusals", "ttft_error_p50", "ttft_error_p90")
        }
    pauses = refusals = 0.0
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kvgate_stream_pauses_total":
                pauses += sample.value
            elif (
                sample.name == "kvgate_queue_rejections_total"
                and sample.labels.get("reason") == "deadline"
            ):
                refusals += sample.value
            elif sample.name == "kvgate_epp_ttft_prediction_error_bucket":
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return {
        "pauses": pauses,
        "deadline_refusals": refusals,
        "ttft_error_p50": _bucket_quantile(buckets, 0.5),
        "ttft_error_p90": _bucket_quantile(buckets, 0.9),
    }


def _bucket_quantile(buckets: dict[float, float], share: float) -> float:
    """The upper bound of the first bucket holding ``share`` of the observations."""
    total = buckets.get(math.inf, 0.0)
    if not total:
        return math.nan
    for bound in sorted(buckets):
        if buckets[bound] >= share * total:
            return bound
    return math.inf


def report(
    results: dict[str, dict[str, list[dict[str, float]]]], objectives: dict[str, float]
) -> None:
    goals = ", ".join(f"{k} {v:g} s" for k, v in objectives.items())
    for workload, rows in results.items():
        print(f"\n{workload} (median of rounds; TTFT objectives for goodput: {goals})\n")
        head = [c for c, _, _ in COLUMNS]
        print(
            "| router | "
            + " | ".join(head)
            + " | failed i/s/b | goodput /s | pauses | refused early | batch answers changed"
            + " | TTFT model error p50/p90 |"
        )
        print("|---|" + "---:|" * (len(head) + 6))
        for name, runs in rows.items():
            m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            cells = [f"{m[a]:.0f} / {m[b]:.0f}" for _, a, b in COLUMNS]
            failed = "/".join(f"{m[f'{c}_failed']:.0f}" for c in OBJECTIVES)
            error = f"{m['ttft_error_p50']:.2f} / {m['ttft_error_p90']:.2f}"
            print(
                f"| {name} | "
                + " | ".join(cells)
                + f" | {failed} | {m['goodput_per_s']:.2f} | {_n(m['pauses'])} | "
                f"{_n(m['deadline_refusals'])} | {m['batch_answers_changed']:.0f} of "
                f"{m['batch_answers_compared']:.0f} | {error} |"
            )


def _n(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.0f}"
