"""Drive the torch runner through the real engine, as the server does."""

from __future__ import annotations

import asyncio
from pathlib import Path

from backends.engine.build import EngineConfig, build_engine
from backends.engine.engine import AsyncEngine
from backends.engine.scheduler import SchedulerConfig
from backends.engine.sequence import SamplingParams
from backends.engine.speculation import SpeculativeConfig
from backends.runners.torch_runner import TorchRunner
from backends.runners.torch_setup import TorchModelSpec, build_torch_runner


def make_runner(
    folder: Path, memory: str = "32MiB", max_loras: int = 1, *, packed: bool = True
) -> TorchRunner:
    return build_torch_runner(
        TorchModelSpec(
            model_path=str(folder),
            kv_cache_memory=memory,
            max_loras=max_loras,
            packed_projections=packed,
        )
    )


def make_engine(
    runner: TorchRunner,
    *,
    budget: int = 2048,
    block_size: int = 16,
    max_loras: int = 1,
    max_model_len: int = 1024,
    speculative: SpeculativeConfig | None = None,
    host_blocks: int = 0,
) -> AsyncEngine:
    config = EngineConfig(
        SchedulerConfig(
            max_num_batched_tokens=budget,
            max_model_len=max_model_len,
            max_loras=max_loras,
            speculative=speculative,
        ),
        block_size=block_size,
        host_blocks=host_blocks,
    )
    return build_engine(config, runner)


def greedy(num_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)


async def collect(
    engine: AsyncEngine, requests: list[tuple[list[int], SamplingParams, str | None]]
) -> list[list[int]]:
    """Submit every request at once and return each one's generated tokens."""
    streams = [engine.add_request(p, s, lora_name=lora) for p, s, lora in requests]

    async def drain(stream: object) -> list[int]:
        tokens: list[int] = []
        while batch := await stream.next_tokens():  # type: ignore[attr-defined]
            tokens.extend(batch)
        return tokens

    return list(await asyncio.gather(*(drain(s) for s in streams)))
