"""A wait that ends when something rings or a time has passed, whichever comes first.

The scraper's pollers rest this way between scrapes, several times a second each: an
``asyncio.Event`` waited with ``asyncio.wait_for`` wraps every wait in a task of its own and,
when the time runs out, cancels it and waits for the cancellation. A doorbell's wait is one
future and one timer.
"""

from __future__ import annotations

import asyncio


class Doorbell:
    """Rings wake every waiter at once; a ring while nobody waits is not remembered (a waiter
    checks the state it cares about before it waits)."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[bool]] = []

    def ring(self) -> None:
        """Wake everyone waiting now."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(True)

    async def wait(self, seconds: float) -> bool:
        """True when rung, False when ``seconds`` passed first."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        timer = loop.call_later(seconds, _time_up, waiter)
        self._waiters.append(waiter)
        try:
            return await waiter
        finally:
            timer.cancel()
            if waiter in self._waiters:  # timed out or cancelled: a ring took the others
                self._waiters.remove(waiter)


def _time_up(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)
