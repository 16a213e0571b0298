"""CLI entries of the load-testing package: ``kvgate loadtest`` and ``kvgate demo``."""

from __future__ import annotations

import argparse


def _run_demo(args: argparse.Namespace) -> int:
    from loadtest.demo.main import main

    return main(args)


def _run_loadtest(args: argparse.Namespace) -> int:
    from loadtest.run.session import run_loadtest

    return run_loadtest(args)


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from loadtest.demo.options import add_options as add_demo_options
    from loadtest.run.options import add_options as add_loadtest_options

    loadtest = subparsers.add_parser(
        "loadtest",
        help="drive an OpenAI-compatible server with a seeded workload and report TTFT, "
        "TPOT, throughput, goodput and cache reuse",
    )
    add_loadtest_options(loadtest)
    loadtest.set_defaults(func=_run_loadtest)
    demo = subparsers.add_parser(
        "demo", help="simulated backends behind the gateway: KV-aware routing against a baseline"
    )
    add_demo_options(demo)
    demo.set_defaults(func=_run_demo)
