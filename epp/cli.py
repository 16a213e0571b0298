"""``kvgate epp --policy FILE [--workers N]``: run the endpoint picker as a gRPC service."""

from __future__ import annotations

import argparse
import sys

from epp.server import GrpcTls
from epp.workers import EppOptions, load, run
from kvgate.wire import app_logging
from policies.errors import PolicyError


def _run(args: argparse.Namespace) -> int:
    app_logging.configure()
    wants_tls = args.tls_cert or args.tls_key or args.tls_client_ca
    if wants_tls and not (args.tls_cert and args.tls_key):
        print("--tls-cert and --tls-key go together (--tls-client-ca needs both)", file=sys.stderr)
        return 2
    tls = GrpcTls(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    options = EppOptions(
        args.policy, args.config, args.host, args.grpc_port, args.metrics_port, tls, args.workers
    )
    try:
        policy = load(options)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    return run(options, policy)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("epp", help="run the endpoint picker (ext_proc, Pick API, health)")
    p.add_argument("--policy", required=True, help="the policy file (pools, routes, epp)")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a GIE / llm-d EndpointPickerConfig: its plugins and profiles replace the policy's",
    )
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--grpc-port", type=int, default=9002)
    p.add_argument("--metrics-port", type=int, default=9090)
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="picker processes sharing both ports (SO_REUSEPORT); default 1",
    )
    p.add_argument("--tls-cert", help="serve gRPC over TLS with this certificate chain (PEM)")
    p.add_argument("--tls-key", help="the certificate's private key (PEM)")
    p.add_argument("--tls-client-ca", help="require client certificates signed by this CA")
    p.set_defaults(func=_run)
