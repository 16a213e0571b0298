"""``kvgate demo``'s options (a module of its own: every ``kvgate`` command builds the whole
parser, and the demo's code need not be imported for that)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", type=int, default=4, help="backends to start")
    parser.add_argument(
        "--runner",
        choices=("sim", "torch"),
        default="sim",
        help="sim: the simulated runner; torch: the tiny random-weight model",
    )
    parser.add_argument("--groups", type=int, default=16, help="shared system prompts")
    parser.add_argument("--prefix-tokens", type=int, default=1600, help="each prompt's size")
    parser.add_argument("--requests", type=int, default=256, help="requests per run")
    parser.add_argument("--rate", type=float, default=48.0, help="requests/s, Poisson")
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument(
        "--num-blocks", type=int, default=560, help="KV blocks per backend (16 tokens each)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=Path("demo-results"), help="where results files and plots go"
    )
