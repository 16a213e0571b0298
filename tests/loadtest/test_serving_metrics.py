"""The metric math against tables computed by hand, in vllm bench serve's definitions."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest

from loadtest.reports.records import RequestRecord
from loadtest.reports.serving_metrics import (
    benchmark_result,
    errors_by_kind,
    max_concurrency,
    max_output_tokens_per_s,
)
from loadtest.reports.stage_report import Stage, stage_report
from loadtest.reports.stats import percentile, summarize
from loadtest.workloads.reuse_oracle import cacheable_tokens


def at(report: Mapping[str, object], *path: str | int) -> object:
    """The value at ``path`` in a nested report (dicts by key, lists by index)."""
    value: object = report
    for step in path:
        assert isinstance(value, Mapping | list), (path, value)
        value = value[step]  # type: ignore[index]
    return value


def test_percentile_interpolates_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_summarize_scales_and_handles_nothing() -> None:
    summary = summarize([0.001, 0.002, 0.003, 0.006], scale=1000)
    assert (summary.mean, summary.median, summary.min, summary.max) == pytest.approx(
        (3.0, 2.5, 1.0, 6.0)
    )
    assert summary.std == pytest.approx(math.sqrt(3.5))  # population sd of 1, 2, 3, 6
    assert summary.count == 4
    assert math.isnan(summarize([]).mean)


# Three requests by hand: (start s, ttft s, latency s, chunk gaps s, prompt, output tokens)
A = RequestRecord(
    0.0, ttft=0.1, latency=0.5, itls=[0.1, 0.1, 0.1, 0.1], prompt_tokens=100, output_tokens=5
)
B = RequestRecord(
    0.2, ttft=0.3, latency=0.4, itls=[0.1], prompt_tokens=50, output_tokens=2, cached_tokens=32
)
C = RequestRecord(1.0, ttft=0.2, latency=0.2, prompt_tokens=10, output_tokens=1)
FAILED = RequestRecord(1.5, error_kind="http_5xx", error="overloaded", latency=0.01)


def test_benchmark_result_against_a_hand_computed_table() -> None:
    result = benchmark_result([A, B, C, FAILED], duration=2.0, slo_ms={"ttft": 250, "tpot": 100})
    assert result["completed"] == 3 and result["failed"] == 1
    assert result["total_input_tokens"] == 160 and result["total_output_tokens"] == 8
    assert result["request_throughput"] == 1.5
    assert result["output_throughput"] == 4.0
    assert result["total_token_throughput"] == 84.0
    # TTFT 100, 300, 200 ms
    assert result["mean_ttft_ms"] == pytest.approx(200) and result[
        "median_ttft_ms"
    ] == pytest.approx(200)
    assert result["p90_ttft_ms"] == pytest.approx(280)  # 200 + 0.8 x 100
    # TPOT: A (0.5-0.1)/4 = 100 ms, B (0.4-0.3)/1 = 100 ms, C has one token: none
    assert result["mean_tpot_ms"] == pytest.approx(100) and result["std_tpot_ms"] == pytest.approx(
        0
    )
    # ITL: five gaps of 100 ms; E2EL 500, 400, 200 ms
    assert result["p99_itl_ms"] == pytest.approx(100)
    assert result["mean_e2el_ms"] == pytest.approx(1100 / 3)
    # good: A (ttft 100, tpot 100) and C (ttft 200); B misses the TTFT SLO; FAILED is not good
    assert result["request_goodput"] == 1.0
    assert result["ttfts"] == [0.1, 0.3, 0.2, 0.0] and at(result, "errors", -1) == "overloaded"
    assert result["max_concurrent_requests"] == 2
    assert benchmark_result([A], 1.0)["request_goodput"] is None
    with pytest.raises(ValueError, match="unknown SLO"):
        benchmark_result([A], 1.0, {"itl": 5})


def test_concurrency_tokens_per_second_and_errors() -> None:
    assert max_concurrency([A, B, C]) == 2  # A and B overlap; C starts after both ended
    assert max_concurrency([RequestRecord(0, latency=1), RequestRecord(1, latency=1)]) == 1
    # A's 5 tokens at 0.1..0.5 s and B's 2 at 0.5, 0.6 fall in second 0; C's at 1.2 in second 1
    assert max_output_tokens_per_s([A, B, C]) == 7
    assert errors_by_kind([A, FAILED, FAILED]) == {"http_5xx": 2}


def test_stage_report_splits_by_stage() -> None:
    records = [
        A,
        B,
        RequestRecord(5.0, stage=1, ttft=0.2, latency=0.3, itls=[0.1], output_tokens=2),
        FAILED,
    ]
    stages = [Stage(rate=2.0, duration=5.0), Stage(rate=4.0)]
    first, second = stage_report(records, stages, [5.0, 1.0])
    assert first["load_summary"] == {
        "count": 3,
        "send_duration": 1.5,
        "requested_rate": 2.0,
        "concurrency": None,
        "achieved_rate": pytest.approx(2 / 1.5),
    }
    assert at(first, "successes", "count") == 2
    tokens = at(first, "successes", "throughput", "output_tokens_per_sec")
    assert tokens == pytest.approx(7 / 5)
    ttft = at(first, "successes", "latency", "time_to_first_token", "mean")
    assert ttft == pytest.approx(0.2)
    assert first["failures"] == {"count": 1, "by_kind": {"http_5xx": 1}}
    assert at(second, "successes", "throughput", "requests_per_sec") == 1.0
    assert second["label"] == "4 req/s"


def test_the_reuse_oracle_counts_shared_leading_blocks() -> None:
    shared = list(range(8))
    prompts = [
        [*shared, 100, 101],  # first sight: nothing cacheable
        [*shared, 200, 201],  # the two leading 4-token blocks were seen
        [0, 1, 2, 3, 9, 9, 9, 9, 9],  # only the first block matches; the chain breaks after it
        [*shared],  # 8 tokens: only the first full block of its first 7 counts
    ]
    assert cacheable_tokens(prompts, block=4) == 0 + 8 + 4 + 4
