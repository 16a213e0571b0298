"""``kvgate epp --policy FILE``: run the endpoint picker as a gRPC service."""

from __future__ import annotations

import argparse
import asyncio
import sys

from epp.registry import CATALOG
from epp.server import GrpcTls, serve
from kvgate.wire import app_logging
from policies.errors import PolicyError
from policies.loader import load_policy, with_picker_config


def _run(args: argparse.Namespace) -> int:
    app_logging.configure()
    try:
        policy = load_policy(args.policy, plugins=CATALOG)
        if args.config:
            policy = with_picker_config(policy, args.config, plugins=CATALOG)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            print("--tls-cert and --tls-key go together", file=sys.stderr)
            return 2
        tls = GrpcTls(args.tls_cert, args.tls_key, args.tls_client_ca)
    elif args.tls_client_ca:
        print("--tls-client-ca needs --tls-cert and --tls-key", file=sys.stderr)
        return 2
    asyncio.run(serve(policy, args.host, args.grpc_port, args.metrics_port, tls))
    return 0


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
    p.add_argument("--tls-cert", help="serve gRPC over TLS with this certificate chain (PEM)")
    p.add_argument("--tls-key", help="the certificate's private key (PEM)")
    p.add_argument("--tls-client-ca", help="require client certificates signed by this CA")
    p.set_defaults(func=_run)
