"""What ``kvgate loadtest``'s options describe: the stages, the SLOs, the request count and
the workload."""

from __future__ import annotations

import argparse
import math

from loadtest.reports.serving_metrics import SLO_NAMES
from loadtest.reports.stage_report import Stage
from loadtest.workloads.agentic import AgentShape, agentic
from loadtest.workloads.arrivals import parse_stages
from loadtest.workloads.chats import Chain, multi_turn, shared_prefix
from loadtest.workloads.custom_jsonl import load_custom
from loadtest.workloads.lora_mix import with_adapters
from loadtest.workloads.mooncake import Replay, TraceRequest, load_trace, trace_chains, window
from loadtest.workloads.sharegpt import load_sharegpt
from loadtest.workloads.synthetic import long_context, random_lengths


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
            round((args.system_tokens or 400) * cpt),
            round(args.turn_tokens * cpt),
            seed,
        )
    elif args.workload == "agentic":
        shape = agent_shape(args)
        chains = agentic(max(1, math.ceil(count / shape.mean_calls)), shape, seed)
    elif args.workload == "random":
        chains = random_lengths(
            count, args.input_tokens, args.output_tokens, args.range_ratio, seed, cpt
        )
    elif args.workload == "long-context":
        questions = max(1, math.ceil(count / args.documents))
        chains = long_context(args.documents, questions, args.input_tokens, seed, cpt)
    elif args.workload == "trace":
        chains = trace_chains(trace_window(args), trace_replay(args), seed)
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


def agent_shape(args: argparse.Namespace) -> AgentShape:
    """The sessions ``--workload agentic`` sends."""
    cpt = args.chars_per_token
    return AgentShape(
        agents=args.agents,
        system_chars=round((args.system_tokens or 4000) * cpt),
        min_calls=args.min_calls,
        max_calls=args.max_calls,
        tool_chars=round(args.tool_tokens * cpt),
        answer_chars=round(args.output_tokens * cpt),
        pause=args.tool_pause,
        session_via=args.session_header,
    )


def trace_replay(args: argparse.Namespace) -> Replay:
    """How ``--workload trace`` replays ``--trace``: its window and scales."""
    if args.trace_block_tokens < 1 or args.time_scale <= 0 or args.trace_every < 1:
        raise ValueError("--trace-block-tokens, --time-scale and --trace-every must be positive")
    return Replay(
        block_tokens=args.trace_block_tokens,
        time_scale=args.time_scale,
        output_scale=args.trace_output_scale,
        start=args.trace_start,
        duration=args.trace_duration,
        every=args.trace_every,
        limit=args.num_requests,
    )


def trace_window(args: argparse.Namespace) -> list[TraceRequest]:
    """The requests of ``--trace`` that ``--workload trace`` replays."""
    if args.trace is None:
        raise ValueError("--workload trace needs --trace FILE (Mooncake's JSON lines, or .gz)")
    return window(load_trace(args.trace), trace_replay(args))
