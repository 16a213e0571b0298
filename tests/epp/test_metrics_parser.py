"""Reading model-server metrics: vLLM names (from the real backend's registry) and SGLang's."""

from __future__ import annotations

from prometheus_client import generate_latest

from backends.cli import build_state
from backends.engine.sequence import SamplingParams
from epp.datalayer.metrics_parser import SGLANG, parse_metrics
from kvgate.cli import build_parser


def test_parses_the_reference_backends_metrics() -> None:
    args = build_parser().parse_args(
        [
            "backend",
            "--port",
            "1",
            "--model",
            "m",
            "--num-blocks",
            "64",
            "--max-num-seqs",
            "4",
            "--max-model-len",
            "256",
            "--max-num-batched-tokens",
            "256",
            "--max-loras",
            "2",
            "--lora-modules",
            "sql=/x",
            "--cost",
            "zero",
            "--default-max-tokens",
            "16",
        ]
    )
    state = build_state(args)
    scheduler = state.engine.scheduler
    state.engine.add_request([1, 2, 3], SamplingParams(max_tokens=4), lora_name="sql")
    scheduler.schedule()
    metrics = parse_metrics(generate_latest(state.metrics.registry).decode())
    assert (metrics.running, metrics.waiting) == (1, 0)
    assert metrics.block_size == 16 and metrics.num_gpu_blocks == 64
    assert metrics.running_loras == frozenset({"sql"}) and metrics.max_loras == 2
    assert 0 < metrics.kv_usage <= 1 and metrics.scraped_at > 0


def test_newest_lora_series_wins_and_sglang_names() -> None:
    text = "\n".join(
        [
            "# HELP x",
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 100.0',
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters="c"} 200.0',
            'vllm:num_requests_waiting{model_name="m"} 3.0',
        ]
    )
    metrics = parse_metrics(text)
    assert metrics.running_loras == {"a", "b"} and metrics.waiting_loras == {"c"}
    assert metrics.waiting == 3
    sglang = parse_metrics(
        "sglang:num_queue_reqs 4\nsglang:token_usage 0.5\n"
        'sglang:cache_config_info{page_size="8",num_pages="100"} 1',
        SGLANG,
    )
    assert (sglang.waiting, sglang.kv_usage, sglang.block_size, sglang.num_gpu_blocks) == (
        4,
        0.5,
        8,
        100,
    )


def test_only_exact_sample_lines_count() -> None:
    text = "\n".join(
        [
            "vllm:num_requests_running 5",  # the very first line
            "# TYPE vllm:num_requests_waiting gauge",
            "# HELP vllm:num_requests_waiting 99 is not a sample",
            "vllm:num_requests_waiting_total 77",  # a longer name
            'vllm:num_requests_waiting{model_name="m",engine="0"} 2',
            "vllm:kv_cache_usage_perc not-a-number",
            'vllm:kv_cache_usage_perc{model_name="m"} 0.25',
            'vllm:cache_config_info{block_size="32",num_gpu_blocks="512"} 1.0',
        ]
    )
    metrics = parse_metrics(text)
    assert (metrics.running, metrics.waiting, metrics.kv_usage) == (5, 2, 0.25)
    assert (metrics.block_size, metrics.num_gpu_blocks) == (32, 512)
