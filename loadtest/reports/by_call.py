"""TTFT by a request's call index within its session (its position in its chain): whether a
session's later calls, whose prompts are mostly cached history, stay as fast as its early ones."""

from __future__ import annotations

import math

from loadtest.reports.records import RequestRecord
from loadtest.reports.stats import percentile

# (first call, last call, label), calls counted from 0, labels from 1 as people count them
BUCKETS = ((0, 0, "1"), (1, 1, "2"), (2, 4, "3-5"), (5, 9, "6-10"), (10, 19, "11-20"))
LAST = (20, math.inf, "21+")


def ttft_by_call(records: list[RequestRecord]) -> list[dict[str, object]]:
    """Per bucket of call indexes that holds a successful request: its label, how many, TTFT
    p50 and p90 in ms, and the share of their prompt tokens served from cache."""
    rows: list[dict[str, object]] = []
    for first, last, label in (*BUCKETS, LAST):
        chosen = [r for r in records if r.ok and first <= r.call <= last]
        if not chosen:
            continue
        ttfts = [r.ttft * 1000 for r in chosen]
        prompt = sum(r.prompt_tokens for r in chosen)
        rows.append(
            {
                "calls": label,
                "requests": len(chosen),
                "ttft_p50_ms": percentile(ttfts, 50),
                "ttft_p90_ms": percentile(ttfts, 90),
                "cached_share": sum(r.cached_tokens for r in chosen) / prompt if prompt else None,
            }
        )
    return rows


def by_call_lines(rows: list[dict[str, object]], width: int) -> list[str]:
    """The table's lines for a run summary (none when every request was a first call)."""
    if len(rows) < 2:
        return []
    lines = ["{s:{c}^{n}}".format(s=" TTFT by call in session ", n=width, c="-")]
    lines.append(f"{'calls':<8}{'requests':>10}{'p50 ms':>10}{'p90 ms':>10}{'cached':>10}")
    for row in rows:
        share = row["cached_share"]
        cached = f"{share:.1%}" if isinstance(share, float) else "n/a"
        lines.append(
            f"{row['calls']!s:<8}{row['requests']!s:>10}{row['ttft_p50_ms']:>10.1f}"
            f"{row['ttft_p90_ms']:>10.1f}{cached:>10}"
        )
    return lines
