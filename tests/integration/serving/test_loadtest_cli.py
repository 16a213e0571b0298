"""``kvgate loadtest`` end to end against a real simulated backend: a ramp, a closed loop, the
files it writes (vllm bench serve's keys), the backends' counters and the oracle, --compare;
and ``kvgate demo`` on a small workload, including SIGTERM leaving no process behind. The
commands run in this process (``kvgate.cli.main``) except where signals are the point."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvgate.cli import main
from loadtest.harness.proc_stats import process_tree
from loadtest.workloads.agentic import AgentShape, agentic

KVGATE = [sys.executable, "-m", "kvgate"]


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run_kvgate(capsys: pytest.CaptureFixture[str]) -> Callable[..., Done]:
    """``kvgate ARGS`` in this process: its exit code and what it printed."""

    def run(*args: str) -> Done:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return Done(code, out, err)

    return run


def test_a_ramp_end_to_end(
    start_backend: Callable[..., str], run_kvgate: Callable[..., Done], tmp_path: Path
) -> None:
    _loadtest = _with(run_kvgate)
    url = start_backend("--cost", "default", "--num-blocks", "600")
    out = tmp_path / "ramp"
    done = _loadtest(
        "--url",
        url,
        "--workload",
        "shared-prefix",
        "--groups",
        "3",
        "--prefix-tokens",
        "200",
        "--stages",
        "20:1,40:1",
        "--output-tokens",
        "4",
        "--backend-metrics",
        url,
        "--tokenize-url",
        url,
        "--goodput",
        "ttft:5000",
        "--out",
        str(out),
        "--label",
        "ramp",
    )
    assert done.returncode == 0, done.stderr
    assert "Serving Benchmark Result" in done.stdout
    result = json.loads((out / "results.json").read_text())
    sent = result["completed"] + result["failed"]
    assert result["failed"] == 0 and 30 <= sent <= 66  # ~20 + ~40, Poisson, capped at 66
    assert result["total_output_tokens"] == 4 * result["completed"]
    assert result["endpoint_type"] == "openai-chat" and result["label"] == "ramp"
    assert result["request_goodput"] == result["request_throughput"]  # nobody near 5 s
    extras = result["kvgate"]
    assert [s["load_summary"]["requested_rate"] for s in extras["stages"]] == [20.0, 40.0]
    assert extras["backends"]["per_backend"][url]["requests"] == result["completed"]
    assert 0.5 < extras["prefix_cache_hit_rate"] <= 1  # 3 prompts, many questions each
    # one backend that evicts nothing: all but what arrives while its group's first prefill runs
    assert 0.6 < extras["captured_reuse"] <= 1.0
    assert json.loads((out / "stages.json").read_text())["stages"] == extras["stages"]
    assert (out / "run-latency-cdf.png").stat().st_size > 10_000
    assert (out / "run-stages.png").exists()

    closed = _loadtest(
        "--url",
        url,
        "--workload",
        "random",
        "--input-tokens",
        "50",
        "--concurrency",
        "3",
        "--num-requests",
        "9",
        "--output-tokens",
        "3",
        "--out",
        str(tmp_path / "closed"),
        "--no-plots",
        "--label",
        "closed",
    )
    assert closed.returncode == 0, closed.stderr
    closed_result = json.loads((tmp_path / "closed" / "results.json").read_text())
    assert closed_result["completed"] == 9 and closed_result["max_concurrency"] == 3
    assert closed_result["max_concurrent_requests"] <= 3

    compared = _loadtest(
        "--compare",
        str(out / "results.json"),
        str(tmp_path / "closed" / "results.json"),
        "--out",
        str(tmp_path / "cmp"),
    )
    assert compared.returncode == 0, compared.stderr
    assert "| metric | ramp | closed |" in compared.stdout
    assert (tmp_path / "cmp" / "compare-latency-cdf.png").exists()


def test_clear_errors_for_bad_options(run_kvgate: Callable[..., Done], tmp_path: Path) -> None:
    _loadtest = _with(run_kvgate)
    missing = _loadtest("--workload", "random")
    assert missing.returncode == 2 and "--url is required" in missing.stderr
    bad = _loadtest("--url", "http://127.0.0.1:9", "--stages", "5,10:3")
    assert bad.returncode == 2 and "only the last stage" in bad.stderr
    no_file = _loadtest("--url", "http://127.0.0.1:9", "--workload", "sharegpt")
    assert no_file.returncode == 2 and "needs --dataset" in no_file.stderr
    slo = _loadtest("--url", "http://127.0.0.1:9", "--goodput", "latency:5")
    assert slo.returncode == 2 and "--goodput 'latency:5'" in slo.stderr


def test_a_dead_server_is_counted_as_connection_errors(
    run_kvgate: Callable[..., Done], tmp_path: Path
) -> None:
    _loadtest = _with(run_kvgate)
    from loadtest.harness.processes import free_port

    done = _loadtest(
        "--url",
        f"http://127.0.0.1:{free_port()}",
        "--workload",
        "random",
        "--num-requests",
        "5",
        "--rate",
        "50",
        "--out",
        str(tmp_path),
        "--no-plots",
    )
    assert done.returncode == 1  # nothing completed
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["failed"] == 5 and result["kvgate"]["errors_by_kind"] == {"connection": 5}


def _with(run_kvgate: Callable[..., Done]) -> Callable[..., Done]:
    def loadtest(*args: str) -> Done:
        return run_kvgate("loadtest", "--no-progress", *args)

    return loadtest


DEMO = [
    "demo",
    "--backends",
    "2",
    "--groups",
    "4",
    "--prefix-tokens",
    "400",
    "--requests",
    "40",
    "--rate",
    "40",
]


def test_the_demo_compares_and_cleans_up(run_kvgate: Callable[..., Done], tmp_path: Path) -> None:
    done = run_kvgate(*DEMO, "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| metric | baseline (least-in-flight) | kvgate (KV-aware EPP) |" in done.stdout
    assert "verdict: " in done.stdout
    for picker in ("least-in-flight", "epp"):
        result = json.loads((tmp_path / picker / "results.json").read_text())
        assert result["completed"] == 40
    assert (tmp_path / "demo-latency-cdf.png").exists()


def test_sigterm_stops_the_demo_and_every_child(tmp_path: Path) -> None:
    with subprocess.Popen(
        [*KVGATE, *DEMO, "--requests", "4000", "--rate", "20", "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as demo:
        _stops_on_sigterm_with_its_children(demo)


def _stops_on_sigterm_with_its_children(demo: subprocess.Popen[str]) -> None:
    try:
        assert demo.stdout is not None
        line = demo.stdout.readline()  # printed once the stack serves
        assert "requests at" in line, line
        tree = process_tree(demo.pid)
        assert len(tree) >= 4  # the demo, two backends, the gateway
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(30) == 128 + signal.SIGTERM
        assert "Traceback" not in demo.stderr.read()  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in tree):
            time.sleep(0.1)
        assert not [p for p in tree if _alive(p)]
    finally:
        if demo.poll() is None:
            demo.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = (
        Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if Path(f"/proc/{pid}/stat").exists()
        else "X"
    )
    return state != "Z"


def test_a_trace_replays_at_its_own_times_and_reports_its_ideal_reuse(
    start_backend: Callable[..., str], run_kvgate: Callable[..., Done], tmp_path: Path
) -> None:
    rows = [
        {"timestamp": 0, "input_length": 2048, "output_length": 3, "hash_ids": [1, 2, 3, 4]},
        {"timestamp": 200, "input_length": 2048, "output_length": 3, "hash_ids": [1, 2, 3, 5]},
        {"timestamp": 400, "input_length": 1024, "output_length": 3, "hash_ids": [6, 7]},
        {"timestamp": 600, "input_length": 2048, "output_length": 3, "hash_ids": [1, 2, 3, 5]},
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    url = start_backend("--cost", "zero")
    out = tmp_path / "trace"
    done = _with(run_kvgate)(
        "--url", url, "--workload", "trace", "--trace", str(trace), "--trace-block-tokens", "64",
        "--time-scale", "0.5", "--tokenize-url", url, "--out", str(out), "--no-plots",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    extras = json.loads((out / "results.json").read_text())["kvgate"]
    assert extras["trace_ideal_reuse"] == pytest.approx(7 / 14)  # 3 + 4 of 14 blocks
    assert len(extras["records"]) == 4 and extras["captured_reuse"] > 0.9
    starts = sorted(r["start"] for r in extras["records"])
    assert starts[-1] - starts[0] == pytest.approx(0.3, abs=0.1)  # 600 ms at half the time
    assert "ideal reuse" in done.stdout


def test_agent_sessions_report_ttft_by_call(
    start_backend: Callable[..., str], run_kvgate: Callable[..., Done], tmp_path: Path
) -> None:
    url = start_backend("--cost", "default", "--num-blocks", "800")
    out = tmp_path / "agents"
    done = _with(run_kvgate)(
        "--url", url, "--workload", "agentic", "--agents", "1", "--system-tokens", "600",
        "--min-calls", "4", "--max-calls", "4", "--tool-tokens", "60", "--tool-pause", "0.1",
        "--session-header", "prompt_cache_key", "--num-requests", "12", "--rate", "8",
        "--output-tokens", "4", "--out", str(out), "--no-plots",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    extras = json.loads((out / "results.json").read_text())["kvgate"]
    records = extras["records"]
    assert len(records) == 12 and sorted(r["call"] for r in records) == sorted([0, 1, 2, 3] * 3)
    by_call = {row["calls"]: row for row in extras["ttft_by_call"]}
    assert set(by_call) == {"1", "2", "3-5"} and by_call["3-5"]["requests"] == 6
    assert by_call["2"]["cached_share"] > 0.8  # the history was cached where it was sent
    shape = AgentShape(1, 600, 4, 4, 60, 4, 0.1, "prompt_cache_key")  # as the options say
    for chain in agentic(3, shape, 0):  # each call waits for the last answer, then its tool
        sent = sorted((r for r in records if r["group"] == chain[0].group), key=lambda r: r["call"])
        for (last, this), request in zip(itertools.pairwise(sent), chain[1:], strict=True):
            assert this["start"] - last["start"] >= last["latency"] + request.pause - 0.005
    assert "TTFT by call in session" in done.stdout
