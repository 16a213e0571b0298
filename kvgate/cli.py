"""The ``kvgate`` command: one CLI whose subcommands live in their own packages."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from backends import cli as backend_cli
from epp import cli as epp_cli
from epp.registry import CATALOG
from gateway import cli as gateway_cli
from loadtest import cli as loadtest_cli
from policies import cli as policy_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgate", description="KV-cache-aware inference gateway and endpoint picker."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    gateway_cli.add_parser(subparsers)
    epp_cli.add_parser(subparsers)
    backend_cli.add_parser(subparsers)
    loadtest_cli.add_parsers(subparsers)
    policy_cli.add_parser(subparsers, plugins=CATALOG)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
