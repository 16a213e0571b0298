"""The monthly report's arithmetic: a counter's rise over its samples, restarts included, and
the month's bounds."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.control.spend_report import month_bounds, series_increase


@pytest.mark.parametrize(
    ("base", "values", "rise"),
    [
        (None, [1.0, 2.5, 4.0], 4.0),  # began in the month: from 0
        (3.0, [3.5, 5.0], 2.0),  # from its value when the month began
        (2.0, [4.0, 1.0, 3.0], 5.0),  # a restart: 2 before it, 3 after
        (None, [], 0.0),
    ],
)
def test_a_counter_rises_by_its_steps_and_restarts(
    base: float | None, values: list[float], rise: float
) -> None:
    assert series_increase(base, values) == pytest.approx(rise)


def test_a_month_ends_at_the_next_or_now() -> None:
    now = datetime(2026, 12, 5, 12, tzinfo=UTC)
    assert month_bounds("2026-11", now) == (
        datetime(2026, 11, 1, tzinfo=UTC),
        datetime(2026, 12, 1, tzinfo=UTC),
    )
    assert month_bounds("2026-12", now) == (datetime(2026, 12, 1, tzinfo=UTC), now)
