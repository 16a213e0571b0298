"""The fleet simulator: the real picker in front of engines stepped in virtual time."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from backends.runners.sim_runner import CostModel
from bench.fleet import FleetRun, arrivals, row, simulate
from bench.fleet_sim import Arrival, FleetSim
from epp.datalayer.indexes.precise_cache import PrecisePrefixCache
from kvgate.wire.request_tokenizer import ReferenceTokenizer

TOKENIZER = ReferenceTokenizer()
REAL_CLOCK = time.monotonic
SYSTEM = "You answer questions about the fleet. " * 40


def arrival(at: float, text: str, max_tokens: int = 4) -> Arrival:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
    return Arrival(at, messages, max_tokens, lambda: TOKENIZER.chat_ids(messages))


def fleet(engines: int, replicas: int = 1, **options: object) -> FleetSim:
    return FleetSim(engines, replicas, num_blocks=512, max_model_len=4096, **options)  # type: ignore[arg-type]


def test_a_lone_request_takes_the_cost_models_prefill_step() -> None:
    one = arrival(0.0, "how many engines?", max_tokens=1)
    tokens = len(one.token_ids())
    result = fleet(2).run([one])
    cost = CostModel()
    expected = cost.step_s + tokens * (cost.prefill_token_s + cost.kv_read_token_s)
    assert result.ttft[0] == pytest.approx(expected)
    assert result.cached == [0] and sorted(result.served) == [0, 1]


def test_a_repeated_prefix_is_served_from_cache_where_it_went() -> None:
    calls = [arrival(n * 0.5, f"question number {n}") for n in range(4)]
    result = fleet(4).run(calls)
    assert max(result.served) == 4  # one engine, sticky: nothing else was loaded
    assert result.cached[0] == 0 and all(c >= len(SYSTEM) for c in result.cached[1:])
    assert result.ttft[1] < result.ttft[0]
    assert time.monotonic is REAL_CLOCK  # the virtual clock is gone once the run is over


def test_replicas_learn_each_others_picks_after_the_lag() -> None:
    calls = [arrival(0.0, "first"), arrival(0.5, "second")]  # replica 0, then replica 1
    result = fleet(8, replicas=2, share_lag=0.002).run(calls)
    assert max(result.served) == 2 and result.cached[1] > 0


def test_precise_replicas_read_the_engines_kv_events() -> None:
    sim = fleet(2, replicas=2, precise=True)
    result = sim.run([arrival(0.0, "one"), arrival(0.3, "two")])
    engine = sim.engines[result.served.index(2)]
    for service in sim.services:
        index = next(
            i for i in service.handle.indexes.values() if isinstance(i, PrecisePrefixCache)
        )
        assert index.index.blocks_of(engine.address) >= len(SYSTEM) // 16


def test_scaled_copies_share_nothing_but_the_chat_templates_header(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    lines = [  # 8 conversations of 5 calls, each resending the last's blocks and one more
        {
            "timestamp": 300 * n,
            "input_length": 512 * (2 + n // 8),
            "output_length": 8,
            "hash_ids": [100 * (n % 8) + b for b in range(2 + n // 8)],
        }
        for n in range(40)
    ]
    trace.write_text("\n".join(json.dumps(line) for line in lines))
    run = FleetRun(20, 1, scale=2, requests=40, trace=trace, first=0)
    items = arrivals(run)
    assert len(items) == 80 and all(a.at <= b.at for a, b in itertools.pairwise(items))
    content = {a.messages[-1]["content"]: a for a in items}
    original = next(a for a in items if not a.messages[-1]["content"].startswith("[1] "))
    copy = content["[1] " + original.messages[-1]["content"]]
    header = len("<|im_start|>user\n")
    ids, copied = original.token_ids(), copy.token_ids()
    assert ids[:header] == copied[:header] and ids[header:] != copied[header : len(ids)]
    figures = row([simulate(run)])
    assert figures["requests"] == 80 and 0.5 < figures["captured_reuse"] <= 1.0
