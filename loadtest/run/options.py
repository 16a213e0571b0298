"""``kvgate loadtest``'s options (only argparse here: every ``kvgate`` command builds the
whole parser). What they describe is built by ``loadtest.run.plan_options``."""

from __future__ import annotations

import argparse
from pathlib import Path

from loadtest.workloads.agentic import SESSION_VIA

WORKLOADS = (
    "shared-prefix",
    "multi-turn",
    "random",
    "long-context",
    "sharegpt",
    "custom",
    "trace",
    "agentic",
)


def add_options(parser: argparse.ArgumentParser) -> None:
    _target_options(parser)
    _workload_options(parser)
    _agent_options(parser)
    _trace_options(parser)
    _load_and_output_options(parser)


def _target_options(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target")
    target.add_argument("--url", help="the server's base URL, e.g. http://127.0.0.1:8080")
    target.add_argument("--model", default="kvgate-sim", help="the model field of each request")
    target.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    target.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    target.add_argument(
        "--backend-metrics",
        action="append",
        default=[],
        metavar="URL",
        help="a backend whose /metrics to read before and after (repeat per backend)",
    )
    target.add_argument(
        "--tokenize-url",
        metavar="URL",
        help="a server with POST /tokenize (a backend) to compute the captured-reuse oracle",
    )


def _workload_options(parser: argparse.ArgumentParser) -> None:
    work = parser.add_argument_group("workload")
    work.add_argument("--workload", choices=WORKLOADS, default="shared-prefix")
    work.add_argument("--seed", type=int, default=0, help="of the prompts and the arrivals")
    work.add_argument("--num-requests", type=int, help="how many to send (default: the ramp's)")
    work.add_argument("--output-tokens", type=int, default=32, help="max_tokens (ignore_eos)")
    work.add_argument(
        "--chars-per-token",
        type=float,
        default=1.0,
        help="prompt sizing: 1 for the byte tokenizer, ~4 for BPE models",
    )
    work.add_argument("--groups", type=int, default=12, help="shared-prefix: system prompts")
    work.add_argument("--prefix-tokens", type=int, default=1600, help="shared-prefix: their size")
    work.add_argument(
        "--question-tokens", type=int, default=40, help="shared-prefix: each question"
    )
    work.add_argument("--sessions", type=int, default=12, help="multi-turn: conversations")
    work.add_argument(
        "--system-tokens", type=int, help="multi-turn / agentic: system prompt (400 / 4000)"
    )
    work.add_argument("--turns", type=int, default=6, help="multi-turn: turns each")
    work.add_argument("--turn-tokens", type=int, default=120, help="multi-turn: a turn's size")
    work.add_argument("--input-tokens", type=int, default=512, help="random / long-context")
    work.add_argument("--range-ratio", type=float, default=0.5, help="random: length spread")
    work.add_argument("--documents", type=int, default=4, help="long-context: documents")
    work.add_argument(
        "--dataset", type=Path, help="sharegpt: the JSON file; custom: vLLM's JSON-lines file"
    )
    work.add_argument("--sharegpt-turns", choices=("first", "all"), default="first")
    work.add_argument("--lora-adapters", help="comma-separated adapters drawn per conversation")
    work.add_argument("--lora-zipf", type=float, default=1.0, help="the Zipf exponent")


def _agent_options(parser: argparse.ArgumentParser) -> None:
    agent = parser.add_argument_group("agentic workload (sessions of tool calls)")
    agent.add_argument("--agents", type=int, default=2, help="system prompts the sessions share")
    agent.add_argument("--min-calls", type=int, default=10, help="calls per session, at least")
    agent.add_argument("--max-calls", type=int, default=50, help="calls per session, at most")
    agent.add_argument("--tool-tokens", type=int, default=600, help="a tool result's median")
    agent.add_argument(
        "--tool-pause", type=float, default=2.0, help="mean seconds a tool runs between calls"
    )
    agent.add_argument(
        "--session-header",
        choices=SESSION_VIA,
        default="x-session-id",
        help="how a session names itself: a header, a body field, or none",
    )


def _trace_options(parser: argparse.ArgumentParser) -> None:
    trace = parser.add_argument_group("trace workload (Mooncake's format)")
    trace.add_argument("--trace", type=Path, help="the trace: JSON lines, or .gz")
    trace.add_argument(
        "--trace-block-tokens", type=int, default=512, help="tokens a 512-token block becomes"
    )
    trace.add_argument(
        "--time-scale", type=float, default=1.0, help="the trace's times x this (0.1: 10x faster)"
    )
    trace.add_argument(
        "--trace-output-scale", type=float, default=1.0, help="output lengths x this"
    )
    trace.add_argument("--trace-start", type=float, default=0.0, help="seconds into the trace")
    trace.add_argument("--trace-duration", type=float, help="seconds of the trace replayed")
    trace.add_argument(
        "--trace-every", type=int, default=1, help="every k-th conversation (first block)"
    )


def _load_and_output_options(parser: argparse.ArgumentParser) -> None:
    load = parser.add_argument_group("load")
    shape = load.add_mutually_exclusive_group()
    shape.add_argument("--rate", type=float, help="requests/s, Poisson (open loop)")
    shape.add_argument("--stages", help="a ramp: RATE:SECONDS,... (the last may omit SECONDS)")
    shape.add_argument("--concurrency", type=int, help="requests in flight (closed loop)")
    load.add_argument("--duration", type=float, help="stop sending after this many seconds")
    load.add_argument("--request-timeout", type=float, default=600.0)
    load.add_argument(
        "--goodput",
        nargs="+",
        default=[],
        metavar="NAME:MS",
        help="SLOs for goodput: ttft:MS, tpot:MS and/or e2el:MS",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, default=Path("loadtest-results"), help="a folder")
    out.add_argument("--label", default="", help="the run's name in its file and comparisons")
    out.add_argument("--no-plots", action="store_true")
    out.add_argument("--no-progress", action="store_true")
    out.add_argument(
        "--compare",
        nargs="+",
        type=Path,
        metavar="RESULTS.json",
        help="compare results files (ours or vllm bench serve's) and exit",
    )
