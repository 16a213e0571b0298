"""The results file speaks vllm bench serve's keys, and --compare reads ours and vLLM's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.reports.records import RequestRecord
from loadtest.reports.results_file import read_results, records_of, results_document, write_results
from loadtest.reports.serving_metrics import benchmark_result
from loadtest.reports.table import comparison, run_summary

# What `vllm bench serve --save-result --save-detailed` writes (vLLM 0.32's serve.py), less the
# keys of features we do not have (probes, speculative decoding, diffusion, rtfx, queue times).
VLLM_KEYS = {
    "date",
    "endpoint_type",
    "backend",
    "label",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "start_times",
    "errors",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
} | {
    f"{stat}_{metric}_ms"
    for metric in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "std", "p99")
}

RECORDS = [
    RequestRecord(
        0.0,
        ttft=0.1,
        latency=0.5,
        itls=[0.1] * 4,
        prompt_tokens=100,
        output_tokens=5,
        cached_tokens=64,
    ),
    RequestRecord(0.5, ttft=0.3, latency=0.6, itls=[0.15, 0.15], prompt_tokens=80, output_tokens=3),
    RequestRecord(0.7, error_kind="http_4xx", error="unknown model"),
]


def _document(label: str, **extras: object) -> dict[str, object]:
    return results_document(
        label=label,
        model="m",
        endpoint="chat",
        rate=4.0,
        concurrency=None,
        benchmark=benchmark_result(RECORDS, 2.0),
        extras={"records": [r.as_dict() for r in RECORDS], **extras},
    )


def test_every_vllm_key_is_there_with_vllms_meaning(tmp_path: Path) -> None:
    document = _document("ours")
    assert set(document) >= VLLM_KEYS
    assert document["endpoint_type"] == "openai-chat" and document["request_rate"] == 4.0
    assert document["num_prompts"] == 3 and document["completed"] == 2
    write_results(document, tmp_path / "r.json")
    assert read_results(tmp_path / "r.json")["p99_ttft_ms"] == document["p99_ttft_ms"]


def test_records_round_trip_through_our_file_and_from_vllms_lists() -> None:
    assert records_of(_document("ours")) == RECORDS
    vllm_file = {k: v for k, v in _document("vllm").items() if k != "kvgate"}
    vllm_file["start_times"] = [1000.0, 1000.5, 1000.7]  # vLLM saves perf_counter() values
    rebuilt = records_of(vllm_file)
    assert [r.start for r in rebuilt] == pytest.approx([0.0, 0.5, 0.7])
    assert [r.ok for r in rebuilt] == [True, True, False]
    assert rebuilt[0].itls == RECORDS[0].itls and rebuilt[1].output_tokens == 3
    assert records_of({"duration": 1.0}) == []


def test_comparison_and_summary_tables() -> None:
    table = comparison([_document("a", captured_reuse=0.5), _document("b")], ["a", "b"])
    lines = table.splitlines()
    assert lines[0] == "| metric | a | b |"
    assert "| completed | 2 | 2 |" in lines
    assert "| captured reuse | 50.0% | — |" in lines
    assert not any(line.startswith("| goodput") for line in lines)  # in neither file
    summary = run_summary(_document("a", errors_by_kind={"http_4xx": 1}))
    assert "Successful requests:                     2" in summary
    assert "Errors by kind:                          http_4xx 1" in summary
    assert "Median TTFT (ms):                        200.00" in summary


def test_a_file_that_is_not_a_results_file(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match="no 'duration' key"):
        read_results(tmp_path / "x.json")
    with pytest.raises(ValueError, match="not a results file"):
        read_results(tmp_path / "missing.json")
