"""Open-loop arrivals: the stage syntax, seeded Poisson times at each stage's rate."""

from __future__ import annotations

import itertools
import statistics

import pytest

from loadtest.workloads.arrivals import parse_stages, poisson_starts, stage_of


def test_parse_stages() -> None:
    assert parse_stages("5:30, 10:30,20") == [(5.0, 30.0), (10.0, 30.0), (20.0, 0.0)]
    assert parse_stages("inf") == [(float("inf"), 0.0)]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "no stages"),
        ("x:3", "RATE or RATE:SECONDS"),
        ("0:3", "must be > 0"),
        ("5,10:3", "only the last"),
    ],
)
def test_bad_stages_say_why(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_stages(spec)


def test_poisson_starts_follow_each_stages_rate() -> None:
    stages = [(20.0, 50.0), (80.0, 50.0)]
    starts = poisson_starts(100_000, stages, seed=3)
    assert starts == poisson_starts(100_000, stages, seed=3)
    assert starts == sorted(starts) and starts[-1] < 100
    first = [t for t in starts if t < 50]
    second = [t for t in starts if t >= 50]
    assert len(first) == pytest.approx(1000, rel=0.1)
    assert len(second) == pytest.approx(4000, rel=0.1)
    gaps = [b - a for a, b in itertools.pairwise(second)]
    assert statistics.fmean(gaps) == pytest.approx(1 / 80, rel=0.1)
    assert statistics.pstdev(gaps) == pytest.approx(1 / 80, rel=0.15)  # exponential: sd = mean


def test_poisson_starts_stop_at_the_count_and_an_open_last_stage_runs_on() -> None:
    assert len(poisson_starts(10, [(5.0, 1.0), (5.0, 0.0)], 0)) == 10
    assert poisson_starts(3, [(float("inf"), 0.0)], 0) == [0.0, 0.0, 0.0]


def test_stage_of() -> None:
    stages = [(1.0, 10.0), (2.0, 5.0), (3.0, 0.0)]
    assert [stage_of(t, stages) for t in (0, 9.99, 10, 14.9, 15, 1000)] == [0, 0, 1, 1, 2, 2]
    assert stage_of(99, [(1.0, 10.0)]) == 0
