"""The torch runner's logits and greedy outputs against transformers (fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backends.engine.sequence import SamplingParams
from backends.engine.step import SeqStep, StepInput
from backends.models.config import load_config
from backends.models.decoder import KVCache
from backends.models.projection import packing_supported
from tests.backends.torch.conftest import hf_greedy
from tests.backends.torch.helpers import collect, greedy, make_engine, make_runner

FAMILIES = ["llama", "qwen2"]


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(5, 1000, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def prefill(
    seq_id: int,
    tokens: list[int],
    table: list[int],
    block_size: int = 16,
    lora: str | None = None,
    start: int = 0,
    end: int | None = None,
) -> SeqStep:
    """The chunk ``tokens[start:end]`` of a prompt (a prompt's first chunk when ``start`` is 0:
    attended causally over its own rows; a later one reads the earlier KV through the cache)."""
    end = len(tokens) if end is None else end
    positions = range(start, end)
    slots = [table[p // block_size] * block_size + p % block_size for p in positions]
    return SeqStep(
        seq_id=seq_id,
        input_ids=tokens[start:end],
        start_position=start,
        slot_mapping=slots,
        block_table=table,
        lora_name=lora,
        sampling=SamplingParams(temperature=0.0),
        do_sample=end == len(tokens),
        is_decode=False,
        prompt_token_ids=tokens,
    )


def last_logits(runner: object, steps: list[SeqStep]) -> torch.Tensor:
    """The logits each sequence samples from, captured at the sampler."""
    captured: list[torch.Tensor] = []
    sampler = runner.sampler  # type: ignore[attr-defined]
    original = sampler.sample

    def spy(logits: torch.Tensor, rows: object) -> object:
        captured.append(logits.clone())
        return original(logits, rows)

    sampler.sample = spy
    runner.run_step(StepInput(steps, 16))  # type: ignore[attr-defined]
    return captured[0]


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "plain-matmul"])
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers_for_sequences_of_different_lengths_stacked_in_one_step(
    family: str, packed: bool, model_folders: dict[str, Path], hf_models: dict[str, object]
) -> None:
    runner = make_runner(model_folders[family], packed=packed)
    assert runner.model.projections.packed is (
        packed and packing_supported(runner.device, runner.dtype)
    )
    runner.num_kv_blocks(16)
    prompts = [prompt(n, seed=n) for n in (5, 37, 130)]
    tables = [[3], [9, 4, 7], [20, 21, 22, 23, 24, 25, 26, 27, 28]]
    ours = last_logits(
        runner, [prefill(i, p, t) for i, (p, t) in enumerate(zip(prompts, tables, strict=True))]
    )
    model = hf_models[family]
    for row, tokens in enumerate(prompts):
        with torch.no_grad():
            ref = model(torch.tensor([tokens])).logits[0, -1]  # type: ignore[operator]
        assert (ours[row] - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers_for_later_chunks_of_different_lengths_in_one_step(
    family: str, model_folders: dict[str, Path], hf_models: dict[str, object]
) -> None:
    """The paged path: each prompt's first chunk in one step, the rest (of different lengths,
    read back through the cache with their earlier KV) stacked in the next."""
    runner = make_runner(model_folders[family])
    runner.num_kv_blocks(16)
    prompts = [prompt(n, seed=n) for n in (21, 37, 130)]
    tables = [[3, 5], [9, 4, 7], [20, 21, 22, 23, 24, 25, 26, 27, 28]]
    cuts = (16, 20, 50)
    pairs = list(zip(prompts, tables, cuts, strict=True))
    runner.run_step(StepInput([prefill(i, p, t, end=c) for i, (p, t, c) in enumerate(pairs)], 16))
    ours = last_logits(runner, [prefill(i, p, t, start=c) for i, (p, t, c) in enumerate(pairs)])
    model = hf_models[family]
    for row, tokens in enumerate(prompts):
        with torch.no_grad():
            ref = model(torch.tensor([tokens])).logits[0, -1]  # type: ignore[operator]
        assert (ours[row] - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("cut", [0, 16], ids=["one-chunk", "continued-chunk"])
def test_unwritten_slots_of_a_last_block_are_never_attended(
    cut: int, model_folders: dict[str, Path], hf_models: dict[str, object]
) -> None:
    runner = make_runner(model_folders["llama"])
    runner.num_kv_blocks(16)
    assert runner.cache is not None
    for tensor in runner.cache.layers:  # stale KV of earlier requests
        tensor.normal_(0, 50.0)
    tokens = prompt(21, seed=3)  # the second block holds 5 of 16 slots
    if cut:  # the first block in a step of its own: the rest reads it through the cache
        runner.run_step(StepInput([prefill(0, tokens, [6, 2], end=cut)], 16))
    ours = last_logits(runner, [prefill(0, tokens, [6, 2], start=cut)])
    with torch.no_grad():
        ref = hf_models["llama"](torch.tensor([tokens])).logits[0, -1]  # type: ignore[operator]
    assert (ours[0] - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
async def test_greedy_64_tokens_alone_and_batched_with_other_lengths(
    family: str, model_folders: dict[str, Path], hf_models: dict[str, object]
) -> None:
    engine = make_engine(make_runner(model_folders[family]))
    prompts = [prompt(n, seed=100 + n) for n in (7, 50, 129, 300)]
    expected = [hf_greedy(hf_models[family], p, 64) for p in prompts]
    engine.start()
    try:
        alone = await collect(engine, [(prompts[1], greedy(64), None)])
        batched = await collect(engine, [(p, greedy(64), None) for p in prompts])
    finally:
        await engine.stop()
    assert alone == [expected[1]]
    assert batched == expected


async def test_greedy_output_is_the_same_with_a_prefix_cache_hit_and_chunked_prefill(
    model_folders: dict[str, Path], hf_models: dict[str, object]
) -> None:
    shared = prompt(160, seed=7)
    first, second = shared + prompt(9, seed=8), shared + prompt(30, seed=9)
    engine = make_engine(make_runner(model_folders["llama"]), budget=48)  # prefill in chunks
    engine.start()
    try:
        (out_first,) = await collect(engine, [(first, greedy(64), None)])
        stream = engine.add_request(second, greedy(64))
        out_second: list[int] = []
        while batch := await stream.next_tokens():
            out_second.extend(batch)
    finally:
        await engine.stop()
    assert stream.seq.num_cached_tokens == 160  # ten full blocks came from the cache
    model = hf_models["llama"]
    assert out_first == hf_greedy(model, first, 64)
    assert out_second == hf_greedy(model, second, 64)


async def test_greedy_output_survives_preemption_and_recompute(
    model_folders: dict[str, Path], hf_models: dict[str, object]
) -> None:
    folder = model_folders["llama"]
    per_block = KVCache.bytes_per_block(load_config(folder), 16, torch.float32)
    runner = make_runner(folder, memory=str(30 * per_block))
    engine = make_engine(runner, max_model_len=256)  # 30 blocks: 4 x 154 tokens cannot fit
    prompts = [prompt(90, seed=20 + i) for i in range(4)]
    engine.start()
    try:
        outs = await collect(engine, [(p, greedy(64), None) for p in prompts])
    finally:
        await engine.stop()
    assert engine.scheduler.stats.num_preemptions > 0
    model = hf_models["llama"]
    assert outs == [hf_greedy(model, p, 64) for p in prompts]


async def test_greedy_output_is_the_same_from_a_prefix_restored_from_the_host_tier(
    model_folders: dict[str, Path], hf_models: dict[str, object]
) -> None:
    folder = model_folders["llama"]
    per_block = KVCache.bytes_per_block(load_config(folder), 16, torch.float32)
    runner = make_runner(folder, memory=str(24 * per_block))
    engine = make_engine(runner, max_model_len=256, host_blocks=64)
    target, others = prompt(170, seed=30), [prompt(170, seed=31 + i) for i in range(3)]
    engine.start()
    try:
        outs = [(await collect(engine, [(p, greedy(16), None)]))[0] for p in [target, *others]]
        stream = engine.add_request(target, greedy(16))  # its blocks were evicted from the
        again: list[int] = []  # device by the others: restored from the host tier
        while batch := await stream.next_tokens():
            again.extend(batch)
    finally:
        await engine.stop()
    assert engine.block_manager.restored_tokens >= 160 and stream.seq.num_cached_tokens == 160
    model = hf_models["llama"]
    assert outs == [hf_greedy(model, p, 16) for p in [target, *others]]
    assert again == outs[0]
