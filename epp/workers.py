"""``kvgate epp --workers N``: N picker processes sharing the gRPC and metrics ports.

The kernel spreads new connections over the workers (SO_REUSEPORT); each worker is a whole
picker (its own scrapes, index and gRPC server). In approximate mode each worker's index also
learns the other workers' picks through ``epp.requestcontrol.pick_exchange``, so a prefix one
worker placed is warm for all. In precise mode each worker subscribes to the engines' KV events
itself, so every index is built from the same events; an EPP that *binds* the events socket
(``kv_events.bind``) can have only one worker. Metrics are written to a shared directory and
every worker's ``/metrics`` answers for all of them (Prometheus multiprocess mode). On SIGTERM
or SIGINT the supervisor stops every worker; a worker that dies is started again; one that
cannot start (a port taken) stops them all.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass

from epp.requestcontrol.pick_exchange import ENV as PICKS_ENV
from epp.requestcontrol.pick_exchange import exchange_directory
from epp.scheduling.registry import CATALOG
from epp.server import GrpcTls, serve
from kvgate.wire import app_logging
from kvgate.wire.supervisor import STARTUP_FAILED, supervise
from policies.loader import load_policy, with_picker_config
from policies.schema import Policy

log = logging.getLogger("kvgate.epp")


@dataclass(frozen=True)
class EppOptions:
    """What each worker needs to start (it loads the policy itself)."""

    policy_path: str
    config: str | None
    host: str
    grpc_port: int
    metrics_port: int
    tls: GrpcTls | None = None
    workers: int = 1


def load(options: EppOptions) -> Policy:
    policy = load_policy(options.policy_path, plugins=CATALOG)
    if options.config:
        policy = with_picker_config(policy, options.config, plugins=CATALOG)
    return policy


def run_worker(options: EppOptions) -> None:
    """One picker process, until SIGTERM or SIGINT."""
    app_logging.configure()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    policy = load(options)
    shared = options.workers > 1
    try:
        asyncio.run(
            serve(
                policy,
                options.host,
                options.grpc_port,
                options.metrics_port,
                options.tls,
                reuse_port=shared,
            )
        )
    except (OSError, RuntimeError) as exc:  # grpc raises RuntimeError for a port it cannot bind
        log.error("epp worker %d cannot start: %s", os.getpid(), exc)
        raise SystemExit(STARTUP_FAILED) from None


def why_not(options: EppOptions, policy: Policy) -> str | None:
    """Why these workers cannot run (in one line), or None."""
    if options.workers > 1 and any(p.kv_events_bind for p in policy.pools.values()):
        return "kv_events.bind (the EPP binds the events socket) allows one worker only"
    for name, port in (
        ("--grpc-port", options.grpc_port),
        ("--metrics-port", options.metrics_port),
    ):
        family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((options.host, port))
        except OSError as exc:
            return f"cannot listen on {options.host}:{port} ({name}): {exc.strerror or exc}"
    return None


def run(options: EppOptions, policy: Policy) -> int:
    """Serve with ``options.workers`` processes; 1 (after one line) if they cannot start."""
    problem = why_not(options, policy)
    if problem is not None:
        log.error("kvgate epp: %s", problem)
        return 1
    if options.workers == 1:
        try:
            run_worker(options)
        except SystemExit as exc:
            return 1 if exc.code == STARTUP_FAILED else int(exc.code or 0)
        return 0
    metrics_dir = os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="kvgate-epp-")
    picks_dir = os.environ[PICKS_ENV] = exchange_directory()
    try:
        return supervise(run_worker, (options,), options.workers, join_timeout=15)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
        shutil.rmtree(picks_dir, ignore_errors=True)
