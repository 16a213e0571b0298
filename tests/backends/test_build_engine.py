"""build_engine sizes the block manager from the runner's KV budget."""

from __future__ import annotations

from typing import cast

import pytest

from backends.engine.build import EngineConfig, build_engine
from backends.engine.kv_connector import KVConnector
from backends.engine.scheduler import SchedulerConfig
from backends.runners.sim_runner import CostModel, SimRunner


class BudgetRunner(SimRunner):
    """A simulated runner whose memory budget holds ``blocks`` KV blocks."""

    def __init__(self, blocks: int) -> None:
        super().__init__([1, 2, 3], CostModel.zero())
        self.blocks = blocks
        self.asked: list[int] = []

    def num_kv_blocks(self, block_size: int) -> int | None:
        self.asked.append(block_size)
        return self.blocks


def test_the_runner_sizes_the_cache() -> None:
    runner = BudgetRunner(blocks=40)
    config = EngineConfig(SchedulerConfig(max_model_len=64), num_blocks=4096, block_size=8)
    engine = build_engine(config, runner)
    assert runner.asked == [8]
    assert engine.block_manager.num_blocks == 40 and engine.block_manager.block_size == 8


def test_a_runner_without_kv_leaves_the_configured_count() -> None:
    config = EngineConfig(SchedulerConfig(max_model_len=64), num_blocks=12, block_size=8)
    engine = build_engine(config, SimRunner([1], CostModel.zero()))
    assert engine.block_manager.num_blocks == 12


def test_a_budget_too_small_for_one_sequence_is_refused() -> None:
    config = EngineConfig(SchedulerConfig(max_model_len=1024), block_size=16)
    with pytest.raises(ValueError, match="exceeds the KV cache"):
        build_engine(config, BudgetRunner(blocks=4))


def test_the_host_tier_is_sized_in_blocks_or_in_bytes_of_kv() -> None:
    runner = SimRunner([1], CostModel.zero())  # 32 KiB of KV per token
    scheduler = SchedulerConfig(max_model_len=64)
    by_bytes = EngineConfig(scheduler, num_blocks=12, block_size=16, host_bytes=2**30)
    host = build_engine(by_bytes, runner).block_manager.host
    assert host is not None and host.num_slots == 2**30 // (16 * 32768)  # 2,048 blocks
    by_blocks = EngineConfig(scheduler, num_blocks=12, host_blocks=5)
    host = build_engine(by_blocks, runner).block_manager.host
    assert host is not None and host.num_slots == 5
    with pytest.raises(ValueError, match="PD worker"):  # its loads write blocks being moved
        build_engine(by_blocks, runner, kv_connector=cast(KVConnector, object()))
    with pytest.raises(ValueError, match="at least one slot"):
        build_engine(EngineConfig(scheduler, num_blocks=12, host_blocks=-1), runner)
