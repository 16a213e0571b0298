"""A deadline that tells a slow peer from a busy event loop.

A timeout measured on the event loop that also serves requests fires late when that loop is
busy, and a reply that arrived in time can still be cut off: its callbacks are queued behind the
timer's. ``within`` waits ``seconds`` for an awaitable; when its timer wakes up late (the loop was
busy, not the peer slow), it grants another ``seconds``, up to ``patience`` in all. Only a timer
that fired on time, or the end of the patience, is a real timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(
    call: Awaitable[T], seconds: float, patience: float, *, keep_running: bool = False
) -> T:
    """``await call``, raising ``TimeoutError`` once a deadline of ``seconds`` passes while the
    loop was on time, or ``patience`` seconds pass in all. The call is then cancelled, unless
    ``keep_running``: it goes on (the caller holds it) and is cancelled ``patience`` seconds
    after it started."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(call)
    start = loop.time()
    deadline = start + seconds
    keep: asyncio.Future[T] | None = None  # the call, left running past a timeout
    woken: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not woken.done():
            woken.set_result(None)

    task.add_done_callback(wake)
    try:
        while True:
            timer = loop.call_at(deadline, wake)
            try:
                await woken
            finally:
                timer.cancel()
            if task.done():
                return task.result()
            now = loop.time()
            late = now - deadline  # how long after its deadline this wait woke up
            if late < seconds / 2 or now - start >= patience:
                if keep_running and now - start < patience:
                    loop.call_at(start + patience, task.cancel)
                    keep = task
                raise TimeoutError(f"no answer within {seconds * 1000:.0f} ms")
            deadline = now + seconds  # the loop was busy: the answer may be queued behind us
            woken = loop.create_future()
    finally:
        if not task.done() and task is not keep:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
