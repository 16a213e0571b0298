"""Summaries of measured samples."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` by rank; NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]
