"""Summaries of measured samples."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

PERCENTILES = (50, 90, 99)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, interpolated linearly between the two
    nearest ranks (numpy's default, which ``vllm bench serve`` uses); NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Summary:
    """Mean, median, population standard deviation and percentiles of one metric."""

    count: int
    mean: float
    median: float
    std: float
    min: float
    max: float
    p50: float
    p90: float
    p99: float

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def summarize(values: list[float], scale: float = 1.0) -> Summary:
    """The summary of ``values`` times ``scale`` (1000 turns seconds into milliseconds); every
    field NaN (count 0) when there are none."""
    if not values:
        nan = float("nan")
        return Summary(0, nan, nan, nan, nan, nan, nan, nan, nan)
    scaled = [v * scale for v in values]
    return Summary(
        len(scaled),
        statistics.fmean(scaled),
        statistics.median(scaled),
        statistics.pstdev(scaled),
        min(scaled),
        max(scaled),
        *(percentile(scaled, q) for q in PERCENTILES),
    )
