"""``kvgate backend --role prefill|decode``: the KV connector and transfer service of a worker.

A prefill worker holds the blocks of requests marked ``do_remote_decode`` and serves them on
its ``KVTransfer`` gRPC port; a decode worker pulls the blocks of requests marked
``do_remote_prefill``. ``both`` (the default) is the monolithic server: no connector.
"""

from __future__ import annotations

import argparse
import uuid
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from backends.engine.engine import AsyncEngine
from backends.engine.kv_blocks import KVBlockIO
from backends.pd.connector import PdConnector
from backends.pd.metrics import PdMetrics
from backends.pd.transfer_client import TransferClient
from backends.pd.transfer_service import KVTransferService, TransferServer

ROLES = ("both", "prefill", "decode")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("prefill/decode disaggregation")
    group.add_argument(
        "--role",
        choices=ROLES,
        default="both",
        help="prefill: hold prompts' KV for decode workers; decode: pull it; both: neither",
    )
    group.add_argument(
        "--kv-transfer-port",
        type=int,
        default=0,
        help="prefill: the KVTransfer gRPC port on --host (0: any free port, announced in "
        "each response's kv_transfer_params)",
    )
    group.add_argument(
        "--kv-lease-seconds",
        type=float,
        default=10.0,
        help="prefill: how long blocks stay held without a decode worker's heartbeat",
    )
    group.add_argument(
        "--prefill-timeout",
        type=float,
        default=60.0,
        help="decode: seconds a prefill hop (x-prefiller-host-port) may take before the "
        "prompt is prefilled here",
    )
    group.add_argument(
        "--kv-transfer-dtype",
        default="",
        help="decode: the dtype KV travels in (float16, float8_e4m3fn; default: the cache's)",
    )


@dataclass(frozen=True, slots=True)
class PdParts:
    connector: PdConnector
    server: TransferServer | None


def make_connector(args: argparse.Namespace, io: KVBlockIO) -> PdConnector | None:
    """The role's connector (None for ``both``); raises ``ValueError`` on bad options."""
    if args.role == "both":
        return None
    if args.kv_lease_seconds <= 0:
        raise ValueError("--kv-lease-seconds must be positive")
    connector = PdConnector(
        io,
        uuid.uuid4().hex,
        lease_seconds=args.kv_lease_seconds,
        serve_transfers=args.role == "prefill",
        client=TransferClient() if args.role == "decode" else None,
        transfer_dtype=args.kv_transfer_dtype,
    )
    connector.host = args.host
    return connector


def attach(
    connector: PdConnector,
    engine: AsyncEngine,
    registry: CollectorRegistry,
    args: argparse.Namespace,
) -> PdParts:
    """Bind ``connector`` to ``engine``, export its metrics, and build a prefill worker's
    transfer server (started with the app)."""
    manager = engine.block_manager
    connector.bind(manager.free, manager.block_size, engine.wake)
    held = connector.held
    connector.metrics = PdMetrics(registry, lambda: 0 if held is None else held.num_blocks)
    server = None
    if held is not None:
        metrics = connector.metrics
        held.on_expired = lambda count: metrics.lease_expiries.inc(count)
        service = KVTransferService(connector.engine_id, held, connector.io, metrics)
        server = TransferServer(service, args.host, args.kv_transfer_port)
    return PdParts(connector, server)
