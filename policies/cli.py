"""``kvgate policy check FILE``: validate a policy and print a summary or every error."""

from __future__ import annotations

import argparse
import getpass
import hashlib
import sys
from functools import partial

from policies.errors import PolicyError
from policies.loader import load_policy
from policies.plugin_catalog import PluginCatalog
from policies.schema import Policy


def summary(policy: Policy) -> str:
    lines = [f"{policy.source}: OK (version {policy.version})"]
    listen = policy.listen
    lines.append(f"  listen: {listen.host}:{listen.port}, {listen.workers} worker(s)")
    auth = policy.auth
    anonymous = ", anonymous allowed" if auth.allow_anonymous else ""
    lines.append(
        f"  auth: {len(auth.api_keys)} API key(s), {len(auth.jwt)} JWT issuer(s){anonymous}"
    )
    for pool in policy.pools.values():
        model = f" as {pool.model}" if pool.model else ""
        lines.append(f"  pool {pool.name}{model}: {len(pool.endpoints)} endpoint(s)")
    for route in policy.routes:
        auto = route.auto_canary
        canary = ""
        if auto is not None:
            steps = ", ".join(f"{s:g}%" for s in auto.steps)
            canary = f", automatic canary {auto.pool} ({steps}; hold {auto.hold:g}s)"
        lines.append(f"  route {route.model} -> {route.pool}{canary}")
    for slo in policy.slos.slos:
        objectives = ", ".join(
            f"{o.name} {o.threshold * 1000:g}ms at {o.target:.2%}"
            if o.threshold
            else f"{o.name} {o.target:.2%}"
            for o in slo.objectives
        )
        lines.append(f"  slo {slo.route} ({slo.class_label}): {objectives}")
    return "\n".join(lines)


def _check(args: argparse.Namespace, plugins: PluginCatalog | None) -> int:
    try:
        policy = load_policy(args.file, plugins=plugins)
    except PolicyError as exc:
        print(f"{exc.source}: {len(exc.errors)} error(s)", file=sys.stderr)
        for error in exc.errors:
            print(f"  {error}", file=sys.stderr)
        return 1
    print(summary(policy))
    return 0


def hash_key(raw: str) -> str:
    """The ``sha256`` a policy's ``api_keys`` entry holds for the key ``raw`` as read from a
    pipe or file: one trailing newline (``echo``'s) is not part of the key."""
    key = raw[:-1] if raw.endswith("\n") else raw
    key = key[:-1] if key.endswith("\r") else key
    if not key:
        raise ValueError("no key on standard input")
    if key != key.strip():
        raise ValueError("the key starts or ends with whitespace: is that really part of it?")
    return hashlib.sha256(key.encode()).hexdigest()


def _hash(args: argparse.Namespace) -> int:
    raw = getpass.getpass("API key: ") + "\n" if sys.stdin.isatty() else sys.stdin.read()
    try:
        digest = hash_key(raw)
    except ValueError as exc:
        print(f"kvgate keys hash: {exc}", file=sys.stderr)
        return 1
    print(digest)
    return 0


def add_keys_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``keys hash``: the sha256 to put in a policy for an API key read from stdin."""
    keys = subparsers.add_parser("keys", help="work with API keys")
    actions = keys.add_subparsers(dest="action", metavar="ACTION", required=True)
    hashing = actions.add_parser(
        "hash",
        help="print the sha256 of an API key read from stdin (for auth.api_keys[].sha256)",
        description='printf %%s "$KEY" | kvgate keys hash   (a trailing newline is ignored)',
    )
    hashing.set_defaults(func=_hash)


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    plugins: PluginCatalog | None = None,
) -> None:
    """``policy check``; ``plugins`` (the EPP's catalog) also checks the EPP's plugins."""
    policy = subparsers.add_parser("policy", help="work with policy files")
    actions = policy.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="validate a policy file")
    check.add_argument("file")
    check.set_defaults(func=partial(_check, plugins=plugins))
