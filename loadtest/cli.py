"""CLI entries of the load-testing package: ``kvgate demo``."""

from __future__ import annotations

import argparse


def _run_demo(args: argparse.Namespace) -> int:
    from loadtest.demo import main

    return main()


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = subparsers.add_parser("demo", help="start simulated backends and show them at work")
    demo.set_defaults(func=_run_demo)
