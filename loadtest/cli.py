"""CLI entries of the load-testing package: ``kvgate demo``."""

from __future__ import annotations

import argparse


def _run_demo(args: argparse.Namespace) -> int:
    from loadtest.demo import main

    return main()


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = subparsers.add_parser(
        "demo", help="simulated backends behind the gateway: KV-cache-aware routing at work"
    )
    demo.set_defaults(func=_run_demo)
