"""``kvgate loadtest``'s options and the workload they describe."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from loadtest.reports.serving_metrics import SLO_NAMES
from loadtest.reports.stage_report import Stage
from loadtest.workloads.arrivals import parse_stages
from loadtest.workloads.chats import Chain, multi_turn, shared_prefix
from loadtest.workloads.custom_jsonl import load_custom
from loadtest.workloads.lora_mix import with_adapters
from loadtest.workloads.sharegpt import load_sharegpt
from loadtest.workloads.synthetic import long_context, random_lengths

WORKLOADS = ("shared-prefix", "multi-turn", "random", "long-context", "sharegpt", "custom")


def add_options(parser: argparse.ArgumentParser) -> None:
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
    work.add_argument("--system-tokens", type=int, default=400, help="multi-turn: system prompt")
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
        help=f"SLOs for goodput: {', '.join(n + ':MS' for n in SLO_NAMES)}",
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


def stages_of(args: argparse.Namespace) -> list[Stage]:
    if args.concurrency is not None:
        if args.concurrency < 1:
            raise ValueError("--concurrency must be at least 1")
        return [Stage(concurrency=args.concurrency)]
    if args.stages:
        return [Stage(rate=r, duration=s) for r, s in parse_stages(args.stages)]
    rate = args.rate if args.rate is not None else 10.0
    if rate <= 0:
        raise ValueError("--rate must be > 0")
    return [Stage(rate=rate)]


def slos_of(args: argparse.Namespace) -> dict[str, float] | None:
    if not args.goodput:
        return None
    slos: dict[str, float] = {}
    for item in args.goodput:
        name, _, value = item.partition(":")
        if name not in SLO_NAMES or not value:
            raise ValueError(f"--goodput {item!r}: expected one of {', '.join(SLO_NAMES)}:MS")
        slos[name] = float(value)
    return slos


def default_count(args: argparse.Namespace, stages: list[Stage]) -> int:
    """Enough requests for the ramp (rate x seconds, 10% spare), else 200."""
    if args.num_requests is not None:
        return int(args.num_requests)
    timed = [s for s in stages if s.rate and s.duration]
    if timed and len(timed) == len(stages):
        return math.ceil(sum(s.rate * s.duration for s in timed) * 1.1)
    return 200


def build_workload(args: argparse.Namespace, count: int) -> list[Chain]:
    seed, cpt = args.seed, args.chars_per_token
    chains: list[Chain]
    if args.workload == "shared-prefix":
        per_group = max(1, math.ceil(count / args.groups))
        chains = shared_prefix(
            args.groups,
            per_group,
            round(args.prefix_tokens * cpt),
            seed,
            round(args.question_tokens * cpt),
        )
    elif args.workload == "multi-turn":
        sessions = max(args.sessions, math.ceil(count / args.turns))
        chains = multi_turn(
            sessions,
            args.turns,
            round(args.system_tokens * cpt),
            round(args.turn_tokens * cpt),
            seed,
        )
    elif args.workload == "random":
        chains = random_lengths(
            count, args.input_tokens, args.output_tokens, args.range_ratio, seed, cpt
        )
    elif args.workload == "long-context":
        questions = max(1, math.ceil(count / args.documents))
        chains = long_context(args.documents, questions, args.input_tokens, seed, cpt)
    elif args.dataset is None:
        raise ValueError(f"--workload {args.workload} needs --dataset FILE")
    elif args.workload == "custom":
        chains = load_custom(args.dataset)
    else:
        chains = load_sharegpt(args.dataset, None, seed, args.sharegpt_turns, cpt)
    if args.lora_adapters:
        adapters = [a.strip() for a in args.lora_adapters.split(",") if a.strip()]
        chains = with_adapters(chains, adapters, args.lora_zipf, seed)
    return chains
