"""N copies of one worker process sharing ports, kept running (``--workers N`` of the gateway
and of the endpoint picker).

The workers are started with the ``spawn`` method (a fresh interpreter each: nothing of the
parent's event loop is inherited). SIGTERM or SIGINT to the supervisor is forwarded to every
worker, which then stops on its own terms. A worker that exits while the supervisor is not
stopping is started again, unless it exits with ``STARTUP_FAILED`` (it could not start at
all, e.g. a port taken): then every worker is stopped and the supervisor returns 1.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable

STARTUP_FAILED = 3  # a worker's exit code when it could not start: not restarted
log = logging.getLogger("kvgate")


def supervise(
    target: Callable[..., None], args: tuple[object, ...], workers: int, join_timeout: float
) -> int:
    """Run ``workers`` processes of ``target(*args)`` until SIGTERM or SIGINT; 0, or 1 when a
    worker could not start. ``join_timeout``: how long each may take to stop."""
    context = multiprocessing.get_context("spawn")

    def start() -> multiprocessing.process.BaseProcess:
        proc = context.Process(target=target, args=args, daemon=False)
        proc.start()
        return proc

    procs = [start() for _ in range(workers)]
    stopping = False
    code = 0

    def forward(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for proc in procs:
            if proc.pid and proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while not stopping:
        time.sleep(0.2)
        for i, proc in enumerate(procs):
            if proc.is_alive() or stopping:
                continue
            if proc.exitcode == STARTUP_FAILED:
                log.error("a worker could not start; stopping the others")
                forward(signal.SIGTERM, None)
                code = 1
            else:
                log.error("worker %s exited with %s; restarting it", proc.pid, proc.exitcode)
                time.sleep(0.5)
                procs[i] = start()
    for proc in procs:
        proc.join(join_timeout)
    return code
