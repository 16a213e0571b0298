"""``kvgate gateway --policy FILE``: start the gateway."""

from __future__ import annotations

import argparse
import logging
import sys

from epp.scheduling.registry import CATALOG
from gateway.base.forwarded import is_loopback
from gateway.workers import ServeOptions, serve
from policies.errors import PolicyError
from policies.loader import load_policy
from policies.schema import Policy

log = logging.getLogger("kvgate.gateway")


def _run(args: argparse.Namespace) -> int:
    options = ServeOptions(args.policy, args.host, args.port, args.workers)
    try:
        policy = options.apply(load_policy(args.policy, plugins=CATALOG))
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    warn_if_open(policy)
    return serve(options, policy)


def warn_if_open(policy: Policy) -> bool:
    """Warn (and say so) when anyone who can reach a non-loopback listener may call it."""
    host = policy.listen.host
    if is_loopback(host) or not policy.auth.allow_anonymous:
        return False
    log.warning(
        "listening on %s:%d with no API keys or JWT issuers: anyone who can reach it may "
        "call every model (set auth: in the policy, or listen on 127.0.0.1)",
        host,
        policy.listen.port,
    )
    return True


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("gateway", help="run the OpenAI-compatible gateway")
    p.add_argument("--policy", required=True, help="policy YAML file")
    p.add_argument("--host", help="overrides listen.host")
    p.add_argument("--port", type=int, help="overrides listen.port")
    p.add_argument("--workers", type=int, help="overrides listen.workers (processes)")
    p.set_defaults(func=_run)
