"""Text reports: one run's summary in ``vllm bench serve``'s layout (with kvgate's lines
after it), and the side-by-side comparison of several results files."""

from __future__ import annotations

import math
from collections.abc import Callable

from loadtest.reports.by_call import by_call_lines

WIDTH = 50


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def _extras(document: dict[str, object]) -> dict[str, object]:
    extras = document.get("kvgate")
    return extras if isinstance(extras, dict) else {}


def _line(name: str, value: object, fmt: str = "{:.2f}") -> str:
    text = fmt.format(value) if isinstance(value, int | float) else str(value)
    return f"{name:<40} {text:<10}"


def run_summary(document: dict[str, object]) -> str:
    extras = _extras(document)
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=WIDTH, c="=")]
    lines += [
        _line("Successful requests:", document.get("completed"), "{}"),
        _line("Failed requests:", document.get("failed"), "{}"),
        _line("Benchmark duration (s):", _number(document.get("duration"))),
        _line("Total input tokens:", document.get("total_input_tokens"), "{}"),
        _line("Total generated tokens:", document.get("total_output_tokens"), "{}"),
        _line("Request throughput (req/s):", _number(document.get("request_throughput"))),
    ]
    if document.get("request_goodput") is not None:
        lines.append(_line("Request goodput (req/s):", _number(document.get("request_goodput"))))
    lines += [
        _line("Output token throughput (tok/s):", _number(document.get("output_throughput"))),
        _line("Total token throughput (tok/s):", _number(document.get("total_token_throughput"))),
    ]
    for metric, title in (
        ("ttft", "Time to First Token"),
        ("tpot", "Time per Output Token (excl. 1st token)"),
        ("itl", "Inter-token Latency"),
        ("e2el", "End-to-end Latency"),
    ):
        lines.append("{s:{c}^{n}}".format(s=title, n=WIDTH, c="-"))
        name = metric.upper()
        for key, word in (("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p99", "P99")):
            lines.append(_line(f"{word} {name} (ms):", _number(document.get(f"{key}_{metric}_ms"))))
    lines.append("{s:{c}^{n}}".format(s=" Cache and backends ", n=WIDTH, c="-"))
    for key, title, fmt in (
        ("cached_prompt_share", "Prompt tokens served from cache:", "{:.1%}"),
        ("captured_reuse", "Captured reuse (of the oracle's):", "{:.1%}"),
        ("trace_ideal_reuse", "The trace's ideal reuse (of its blocks):", "{:.1%}"),
        ("prefix_cache_hit_rate", "Backends' prefix-cache hit rate:", "{:.1%}"),
        ("preemptions", "Preemptions:", "{:.0f}"),
        ("load_spread", "Busiest backend ÷ mean requests:", "{:.2f}"),
    ):
        value = extras.get(key)
        if value is None and key == "trace_ideal_reuse":
            continue  # not a trace
        lines.append(_line(title, value if value is not None else "n/a", fmt))
    errors = extras.get("errors_by_kind")
    if isinstance(errors, dict) and errors:
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(errors.items()))
        lines.append(_line("Errors by kind:", kinds))
    by_call = extras.get("ttft_by_call")
    lines += by_call_lines(by_call if isinstance(by_call, list) else [], WIDTH)
    lines.append("=" * WIDTH)
    return "\n".join(lines)


Row = tuple[str, Callable[[dict[str, object]], object], str]

ROWS: tuple[Row, ...] = (
    ("completed", lambda d: d.get("completed"), "{}"),
    ("failed", lambda d: d.get("failed"), "{}"),
    ("req/s", lambda d: d.get("request_throughput"), "{:.2f}"),
    ("output tok/s", lambda d: d.get("output_throughput"), "{:.1f}"),
    ("TTFT p50 ms", lambda d: d.get("median_ttft_ms"), "{:.1f}"),
    ("TTFT p90 ms", lambda d: d.get("p90_ttft_ms"), "{:.1f}"),
    ("TTFT p99 ms", lambda d: d.get("p99_ttft_ms"), "{:.1f}"),
    ("TPOT p50 ms", lambda d: d.get("median_tpot_ms"), "{:.2f}"),
    ("ITL p99 ms", lambda d: d.get("p99_itl_ms"), "{:.2f}"),
    ("E2EL p90 ms", lambda d: d.get("p90_e2el_ms"), "{:.1f}"),
    ("goodput req/s", lambda d: d.get("request_goodput"), "{:.2f}"),
    ("cached prompt share", lambda d: _extras(d).get("cached_prompt_share"), "{:.1%}"),
    ("captured reuse", lambda d: _extras(d).get("captured_reuse"), "{:.1%}"),
    ("backend hit rate", lambda d: _extras(d).get("prefix_cache_hit_rate"), "{:.1%}"),
    ("max ÷ mean load", lambda d: _extras(d).get("load_spread"), "{:.2f}"),
)


def comparison(documents: list[dict[str, object]], labels: list[str]) -> str:
    """A Markdown table: one column per results file, one row per metric ("—": not in it)."""
    lines = ["| metric | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for title, get, fmt in ROWS:
        cells = []
        for document in documents:
            value = get(document)
            ok = isinstance(value, int | float) and not math.isnan(value)
            cells.append(fmt.format(value) if ok else "—")
        if any(c != "—" for c in cells):
            lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
