"""``kvgate gateway --policy FILE``: start the gateway."""

from __future__ import annotations

import argparse
import sys

from epp.registry import CATALOG
from gateway.workers import ServeOptions, serve
from policies.errors import PolicyError
from policies.loader import load_policy


def _run(args: argparse.Namespace) -> int:
    options = ServeOptions(args.policy, args.host, args.port, args.workers)
    try:
        policy = options.apply(load_policy(args.policy, plugins=CATALOG))
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    return serve(options, policy)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("gateway", help="run the OpenAI-compatible gateway")
    p.add_argument("--policy", required=True, help="policy YAML file")
    p.add_argument("--host", help="overrides listen.host")
    p.add_argument("--port", type=int, help="overrides listen.port")
    p.add_argument("--workers", type=int, help="overrides listen.workers (processes)")
    p.set_defaults(func=_run)
