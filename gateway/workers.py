"""Run the gateway: one process, or ``--workers N`` processes sharing the port (SO_REUSEPORT).

Each worker loads the policy itself and runs its own event loop (uvloop) with its own pooled
upstream session. On SIGTERM the parent forwards the signal; each worker stops accepting and
lets in-flight requests (streams included) finish for up to ``listen.shutdown_grace`` seconds.
A worker that dies unexpectedly is restarted.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from dataclasses import dataclass, replace

from epp.requestcontrol.pick_exchange import ENV as PICKS_ENV
from epp.requestcontrol.pick_exchange import exchange_directory
from epp.scheduling.registry import CATALOG
from gateway.app import create_app
from gateway.base.build_info import request_path_compiled
from gateway.lifecycle import running
from kvgate.wire import app_logging
from kvgate.wire.supervisor import STARTUP_FAILED, supervise
from policies.loader import load_policy
from policies.schema import Policy

log = logging.getLogger("kvgate.gateway")


@dataclass(frozen=True)
class ServeOptions:
    policy_path: str
    host: str | None = None
    port: int | None = None
    workers: int | None = None

    def apply(self, policy: Policy) -> Policy:
        listen = policy.listen
        listen = replace(
            listen,
            host=self.host if self.host is not None else listen.host,
            port=self.port if self.port is not None else listen.port,
            workers=self.workers if self.workers is not None else listen.workers,
        )
        return replace(policy, listen=listen)


def configure_logging() -> None:
    """Application logs as ``app_logging`` says; the access log as JSON lines on stdout."""
    app_logging.configure()
    access = logging.getLogger("kvgate.access")
    if not access.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        access.addHandler(handler)
    access.propagate = False
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def run_worker(options: ServeOptions) -> None:
    """One gateway process (also the whole gateway when workers == 1)."""
    configure_logging()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        log.info("uvloop not available; using the default event loop")
    policy = options.apply(load_policy(options.policy_path, plugins=CATALOG))
    listen = policy.listen
    app = create_app(policy, policy_path=options.policy_path)

    async def serve_until_signalled() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        async with running(app, listen.host, listen.port, reuse_port=listen.workers > 1):
            started.append(True)
            log.info(
                "gateway worker %d listening on %s:%d (request path: %s)",
                os.getpid(),
                listen.host,
                listen.port,
                "compiled" if request_path_compiled() else "python",
            )
            gc.freeze()  # what startup made lives as long as the process: out of every collection
            await stop.wait()
            log.info("gateway worker %d stopping", os.getpid())

    started: list[bool] = []
    try:
        asyncio.run(serve_until_signalled())
    except OSError as exc:
        if started:
            raise
        log.error("gateway worker %d cannot start: %s", os.getpid(), exc)  # one line
        raise SystemExit(STARTUP_FAILED) from None


def unavailable_address(policy: Policy) -> str | None:
    """Why the gateway cannot listen where the policy says (a port taken, an address not
    this host's), in one line; None when it can. Probed before any worker starts."""
    listen = policy.listen
    wanted = [("listen.port", listen.host, listen.port)]
    if listen.admin is not None:
        wanted.append(("listen.admin.port", listen.admin.host, listen.admin.port))
    for field, host, port in wanted:
        if port == 0:
            continue
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if listen.workers > 1 and hasattr(socket, "SO_REUSEPORT"):
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                probe.bind((host, port))
        except OSError as exc:
            return f"cannot listen on {host}:{port} ({field}): {exc.strerror or exc}"
    return None


def serve(options: ServeOptions, policy: Policy) -> int:
    """Run the gateway until SIGTERM/SIGINT; 1 (after one line on stderr) if it cannot start."""
    configure_logging()
    problem = unavailable_address(policy)
    if problem is not None:
        log.error("kvgate gateway: %s", problem)
        return 1
    workers = policy.listen.workers
    if workers == 1:
        try:
            run_worker(options)
        except SystemExit as exc:
            return 1 if exc.code == STARTUP_FAILED else int(exc.code or 0)
        return 0
    metrics_dir = tempfile.mkdtemp(prefix="kvgate-metrics-")
    # the workers' pickers tell each other their picks through sockets here
    # (epp.requestcontrol.pick_exchange)
    picks_dir = os.environ[PICKS_ENV] = exchange_directory()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        return supervise(run_worker, (options,), workers, policy.listen.shutdown_grace + 5)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
        shutil.rmtree(picks_dir, ignore_errors=True)
