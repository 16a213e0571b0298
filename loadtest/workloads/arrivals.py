"""When an open-loop load test sends: seeded Poisson arrivals over a ramp of rates.

Stages are ``(rate, seconds)`` pairs; a stage of 0 seconds lasts until the requests run out.
Inter-arrival gaps are exponential at the current stage's rate; a gap that would cross into
the next stage is drawn again from the boundary at the new rate (a Poisson process forgets its
past, so this is exact). A rate of ``inf`` sends everything at once.
"""

from __future__ import annotations

import math
import random


def parse_stages(spec: str) -> list[tuple[float, float]]:
    """``"5:30,10:30,20"`` -> ``[(5, 30), (10, 30), (20, 0)]``: rate:seconds pairs, a bare
    rate lasting until the requests run out (only the last may be bare)."""
    stages: list[tuple[float, float]] = []
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise ValueError("no stages given")
    for number, part in enumerate(parts):
        rate_text, _, seconds_text = part.partition(":")
        try:
            rate = float(rate_text)
            seconds = float(seconds_text) if seconds_text else 0.0
        except ValueError:
            raise ValueError(f"stage {part!r}: expected RATE or RATE:SECONDS") from None
        if rate <= 0 or seconds < 0 or math.isnan(rate):
            raise ValueError(f"stage {part!r}: the rate must be > 0 and the seconds >= 0")
        if seconds == 0 and number != len(parts) - 1:
            raise ValueError(f"stage {part!r}: only the last stage may run without a duration")
        stages.append((rate, seconds))
    return stages


def poisson_starts(count: int, stages: list[tuple[float, float]], seed: int) -> list[float]:
    """Up to ``count`` start times (seconds from the run's start), ending with the stages."""
    rng = random.Random(seed)
    starts: list[float] = []
    now, stage_start = 0.0, 0.0
    for rate, seconds in stages:
        end = stage_start + seconds if seconds else math.inf
        while len(starts) < count:
            gap = 0.0 if math.isinf(rate) else rng.expovariate(rate)
            if now + gap >= end:
                break
            now += gap
            starts.append(now)
        if len(starts) >= count:
            break
        now = stage_start = end
    return starts


def stage_of(at: float, stages: list[tuple[float, float]]) -> int:
    """The index of the stage running ``at`` seconds after the start."""
    boundary = 0.0
    for index, (_, seconds) in enumerate(stages):
        if not seconds:
            return index
        boundary += seconds
        if at < boundary:
            return index
    return len(stages) - 1
