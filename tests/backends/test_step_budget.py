"""The step's token budget a backend starts with when ``--max-num-batched-tokens`` is not given."""

from __future__ import annotations

import pytest

from backends.cli import build_state
from kvgate.cli import build_parser


def budget(*extra: str) -> int:
    args = build_parser().parse_args(["backend", "--port", "1", "--cost", "zero", *extra])
    return build_state(args).engine.config.max_num_batched_tokens


def test_the_simulated_runner_keeps_4096() -> None:
    assert budget() == 4096


def test_the_flag_wins() -> None:
    assert budget("--max-num-batched-tokens", "512") == 512


def test_without_chunked_prefill_a_whole_prompt_fits_in_a_step() -> None:
    assert budget("--no-chunked-prefill", "--max-model-len", "8192") == 8192
    assert budget("--no-chunked-prefill", "--max-model-len", "1024") == 4096


def test_the_torch_runner_on_a_cpu_takes_vllms_cpu_default() -> None:
    pytest.importorskip("torch")
    from backends.torch_backend import step_budget

    tiny = ("--runner", "torch", "--preset", "tiny", "--device", "cpu")
    assert budget(*tiny, "--kv-cache-memory", "16MiB", "--max-model-len", "512") == 2048
    assert step_budget("cpu") == 2048 and step_budget("cuda") == 4096
