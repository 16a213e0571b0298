"""PNG plots of load tests with matplotlib (the ``loadtest`` extra; without it the plots are
skipped and the caller says so): latency CDFs, TTFT and TPOT against throughput across the
stages of a ramp, TTFT over time, and each backend's share of the requests. The comparison
plots draw several results files on the same axes."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from loadtest.reports.records import RequestRecord
from loadtest.reports.serving_metrics import metric_values

CDF_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "end-to-end"))


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only), its logger quiet."""
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(figure: Any, path: Path) -> Path:
    """Lay ``figure`` out, write it to ``path`` as PNG, and free it."""
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    pyplot().close(figure)
    return path


def _null_formatter() -> Any:
    from matplotlib.ticker import NullFormatter

    return NullFormatter()


def _cdf(axis: Any, values: list[float], label: str) -> None:
    if not values:
        return
    ordered = sorted(v * 1000 for v in values)
    fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
    axis.step(ordered, fractions, where="post", label=label)


def latency_cdfs(runs: dict[str, list[RequestRecord]], path: Path) -> Path:
    plt = pyplot()
    figure, axes = plt.subplots(2, 2, figsize=(10, 7))
    for axis, (metric, title) in zip(axes.flat, CDF_METRICS, strict=True):
        for label, records in runs.items():
            _cdf(axis, metric_values(records, metric), label)
        axis.set_xlabel(f"{title} (ms)")
        axis.set_ylabel("fraction of requests" if metric != "itl" else "fraction of gaps")
        axis.set_xscale("log")
        axis.xaxis.set_minor_formatter(_null_formatter())
        axis.grid(alpha=0.3)
        if len(runs) > 1:
            axis.legend(fontsize=8)
    figure.suptitle("Latency CDFs")
    return save(figure, path)


def ttft_over_time(runs: dict[str, list[RequestRecord]], path: Path) -> Path:
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(10, 4))
    for label, records in runs.items():
        ok = [r for r in records if r.ok]
        axis.scatter([r.start for r in ok], [r.ttft * 1000 for r in ok], s=6, label=label)
    axis.set_xlabel("seconds since start (request sent)")
    axis.set_ylabel("TTFT (ms)")
    axis.set_yscale("log")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return save(figure, path)


def stage_curves(runs: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """TTFT p50/p90 and TPOT p50 against output tokens/s, one point per stage."""
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for label, stages in runs.items():
        x = [s["successes"]["throughput"]["output_tokens_per_sec"] for s in stages]
        latency = [s["successes"]["latency"] for s in stages]
        left.plot(
            x, [v["time_to_first_token"]["p50"] * 1000 for v in latency], "o-", label=f"{label} p50"
        )
        left.plot(
            x,
            [v["time_to_first_token"]["p90"] * 1000 for v in latency],
            "s--",
            label=f"{label} p90",
        )
        right.plot(
            x, [v["time_per_output_token"]["p50"] * 1000 for v in latency], "o-", label=label
        )
    for axis, title in ((left, "TTFT (ms)"), (right, "TPOT p50 (ms)")):
        axis.set_xlabel("output tokens/s (per stage)")
        axis.set_ylabel(title)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    return save(figure, path)


def backend_load(runs: dict[str, dict[str, float]], path: Path) -> Path:
    """Requests each backend served, one group of bars per run."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(runs))
    for number, (label, served) in enumerate(runs.items()):
        names = list(served)
        xs = [i + number * width for i in range(len(names))]
        axis.bar(xs, list(served.values()), width=width, label=label)
        axis.set_xticks([i + width * (len(runs) - 1) / 2 for i in range(len(names))])
        axis.set_xticklabels([n.rsplit("/", 1)[-1] for n in names], rotation=20, fontsize=8)
    axis.set_ylabel("requests served")
    axis.legend(fontsize=8)
    return save(figure, path)


def plot_results(documents: dict[str, dict[str, Any]], out: Path, prefix: str) -> list[Path]:
    """Every plot the documents support, written as ``out/PREFIX-*.png``; the paths."""
    from loadtest.reports.results_file import records_of

    out.mkdir(parents=True, exist_ok=True)
    records = {label: records_of(doc) for label, doc in documents.items()}
    written = [
        latency_cdfs(records, out / f"{prefix}-latency-cdf.png"),
        ttft_over_time(records, out / f"{prefix}-ttft-over-time.png"),
    ]
    stages = {
        label: doc["kvgate"]["stages"]
        for label, doc in documents.items()
        if isinstance(doc.get("kvgate"), dict) and len(doc["kvgate"].get("stages") or []) > 1
    }
    if stages:
        written.append(stage_curves(stages, out / f"{prefix}-stages.png"))
    served = {}
    for label, doc in documents.items():
        backends = (
            doc.get("kvgate", {}).get("backends") if isinstance(doc.get("kvgate"), dict) else None
        )
        rows = backends.get("per_backend") if isinstance(backends, dict) else None
        if rows:
            served[label] = {name: row["requests"] for name, row in rows.items()}
    if served:
        written.append(backend_load(served, out / f"{prefix}-backend-load.png"))
    return written
