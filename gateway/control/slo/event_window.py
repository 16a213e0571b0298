"""Good and total events of one objective over a rolling window, in minute and hour slots.

Minute slots cover the burn-rate windows (up to three days); hour slots cover the objective's
whole window (its budget). A slot remembers which minute or hour it holds, so a slot left
from an earlier turn of the ring is cleared before it counts again.
"""

from __future__ import annotations

import math

MINUTE_SLOTS = 3 * 24 * 60


class EventWindow:
    __slots__ = ("_hour_good", "_hour_total", "_hours", "_minute_good", "_minute_total", "_stamps")

    def __init__(self, window: float) -> None:
        self._hours = max(1, math.ceil(window / 3600))
        self._minute_good = [0] * MINUTE_SLOTS
        self._minute_total = [0] * MINUTE_SLOTS
        self._hour_good = [0] * self._hours
        self._hour_total = [0] * self._hours
        # the minute (or hour) each slot holds, minutes first
        self._stamps = [-1] * (MINUTE_SLOTS + self._hours)

    def add(self, now: float, good: int, total: int) -> None:
        minute = int(now // 60)
        slot = minute % MINUTE_SLOTS
        if self._stamps[slot] != minute:
            self._stamps[slot] = minute
            self._minute_good[slot] = self._minute_total[slot] = 0
        self._minute_good[slot] += good
        self._minute_total[slot] += total
        hour = int(now // 3600)
        slot = hour % self._hours
        if self._stamps[MINUTE_SLOTS + slot] != hour:
            self._stamps[MINUTE_SLOTS + slot] = hour
            self._hour_good[slot] = self._hour_total[slot] = 0
        self._hour_good[slot] += good
        self._hour_total[slot] += total

    def recent(self, now: float, windows: tuple[float, ...]) -> list[tuple[int, int]]:
        """(good, total) over each of ``windows`` (seconds, increasing, at most three days),
        counted in whole minutes back from the current one."""
        out: list[tuple[int, int]] = []
        minute = int(now // 60)
        good = total = 0
        back = 0
        for window in windows:
            minutes = min(MINUTE_SLOTS, max(1, math.ceil(window / 60)))
            while back < minutes:
                slot = (minute - back) % MINUTE_SLOTS
                if self._stamps[slot] == minute - back:
                    good += self._minute_good[slot]
                    total += self._minute_total[slot]
                back += 1
            out.append((good, total))
        return out

    def whole(self, now: float) -> tuple[int, int]:
        """(good, total) over the whole window, in hours back from the current one."""
        hour = int(now // 3600)
        good = total = 0
        for back in range(self._hours):
            slot = (hour - back) % self._hours
            if self._stamps[MINUTE_SLOTS + slot] == hour - back:
                good += self._hour_good[slot]
                total += self._hour_total[slot]
        return good, total
