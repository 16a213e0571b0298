"""Background tasks of the picker's long-running loops."""

from __future__ import annotations

import asyncio
import contextlib


async def cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel every task, wait until each has finished, and forget them."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    tasks.clear()
