"""Mooncake-format traces replayed as text: equal leading block ids give byte-identical prefixes,
lengths scale with the block size, requests keep their own (sped-up) times, and the driver sends
them then."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
from pathlib import Path

import pytest
from aiohttp import web

from loadtest.reports.stage_report import Stage
from loadtest.run.driver import LoadPlan, run_load
from loadtest.workloads.mooncake import Replay, ideal_reuse, load_trace, trace_chains, window
from loadtest.workloads.sharegpt import DatasetError

TRACE = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "synthetic_trace.jsonl"


def _write(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


ROWS = [
    {"timestamp": 1000, "input_length": 1024, "output_length": 100, "hash_ids": [1, 2]},
    {"timestamp": 1500, "input_length": 1300, "output_length": 5, "hash_ids": [1, 2, 3]},
    {"timestamp": 3000, "input_length": 600, "output_length": 0, "hash_ids": [4, 5]},
]


def test_shared_block_ids_are_shared_text_and_times_are_scaled(tmp_path: Path) -> None:
    requests = load_trace(_write(tmp_path, ROWS))
    replay = Replay(block_tokens=64, time_scale=0.1, max_output=32)
    chains = trace_chains(window(requests, replay), replay)
    prompts = [c[0].messages[0]["content"] for c in chains]
    assert [len(p) for p in prompts] == [128, 163, 75]  # input lengths x 64/512, rounded up
    assert prompts[1].startswith(prompts[0])  # ids 1, 2 in both
    assert not prompts[2].startswith(prompts[0][:64])
    assert [c[0].at for c in chains] == [0.0, 0.05, 0.2]
    assert [c[0].max_tokens for c in chains] == [32, 5, 1]
    assert ideal_reuse(requests) == pytest.approx(2 / 7)
    halved = trace_chains(requests, Replay(output_scale=0.5))
    assert [c[0].max_tokens for c in halved] == [50, 2, 1]


@pytest.mark.parametrize(
    ("replay", "kept"),
    [
        (Replay(skip=1, limit=1), [1]),
        (Replay(start=0.5), [1, 2]),  # from 0.5 s into the trace
        (Replay(start=0.2, duration=1.0), [1]),
        (Replay(every=2), [0, 1]),  # the conversations starting with block 1 (not 4)
    ],
)
def test_a_window_picks_what_is_replayed(tmp_path: Path, replay: Replay, kept: list[int]) -> None:
    requests = load_trace(_write(tmp_path, ROWS))
    assert window(requests, replay) == [requests[i] for i in kept]


def test_a_gzipped_trace_reads_the_same(tmp_path: Path) -> None:
    plain = _write(tmp_path, ROWS)
    packed = tmp_path / "trace.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert load_trace(packed) == load_trace(plain)


@pytest.mark.parametrize(
    "line",
    [
        '{"timestamp": 0, "input_length": 5}',
        "not json",
        '{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [1]}',
    ],
)
def test_a_bad_line_is_named(tmp_path: Path, line: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + line + "\n")
    with pytest.raises(DatasetError, match=":2:"):
        load_trace(path)


def test_the_shared_trace_loads() -> None:
    if not TRACE.exists():
        pytest.skip(f"no trace at {TRACE}")
    requests = load_trace(TRACE)
    assert len(requests) == 3993 and round(ideal_reuse(requests), 3) == 0.640


async def test_the_driver_sends_a_trace_at_its_own_times(tmp_path: Path) -> None:
    arrived: list[float] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        arrived.append(asyncio.get_running_loop().time())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(
            b'data: {"choices": [{"delta": {"content": "x"}}]}\n\ndata: [DONE]\n\n'
        )
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        chains = trace_chains(load_trace(_write(tmp_path, ROWS)), Replay(time_scale=0.2))
        plan = LoadPlan(f"http://127.0.0.1:{port}", "m", chains, [Stage(rate=1000.0)])
        run = await run_load(plan)
    finally:
        await runner.cleanup()
    assert all(r.ok for r in run.records) and len(arrived) == 3
    gaps = [b - a for a, b in itertools.pairwise(arrived)]
    assert gaps[0] == pytest.approx(0.1, abs=0.05) and gaps[1] == pytest.approx(0.3, abs=0.05)
