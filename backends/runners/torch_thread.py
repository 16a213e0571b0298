"""The one thread that runs every torch operation of a runner, from loading to sampling.

torch's OpenMP runtime keeps a pool of worker threads per calling thread: when weights are
loaded on one thread and steps run on another, the two pools share the cores and every step
is slower (docs/benchmarks.md, "Engine"). Everything torch does for a runner therefore goes
through this thread, and the event loop that serves HTTP never runs a torch operation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class TorchThread:
    """``inline``: run on the calling thread (an engine process's main thread, where torch
    owns the process and no event loop runs)."""

    def __init__(self, *, inline: bool = False) -> None:
        self.inline = inline
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch")

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` on the torch thread and wait for it (start-up, tests)."""
        if self.inline:
            return fn(*args, **kwargs)
        return self._executor.submit(fn, *args, **kwargs).result()

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` on the torch thread without blocking the event loop."""
        future = self._executor.submit(fn, *args, **kwargs)
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
