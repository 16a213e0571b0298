"""Simulated runner: cost model and deterministic tokens."""

from __future__ import annotations

import pytest

from backends.engine.host_tier import KVTransfer
from backends.engine.step import ScheduledSeq, StepInput
from backends.runners.sim_runner import CostModel, SimRunner
from tests.fakes import make_seq, step_input

COST = CostModel(
    step_s=1.0, prefill_token_s=0.1, decode_seq_s=0.01, kv_read_token_s=0.001, lora_swap_s=5.0
)


def test_cost_of_a_mixed_step() -> None:
    prefill = make_seq(10)
    decode = make_seq(4)
    decode.token_ids.append(1)
    decode.num_computed_tokens = 4
    batch = [ScheduledSeq(prefill, 10), ScheduledSeq(decode, 1)]
    # 1 + 0.1*10 prefill + 0.01*1 decode + 0.001*(10+5) kv + 5*1 swap
    assert COST.step_time(step_input(batch), 1) == pytest.approx(1 + 1.0 + 0.01 + 0.015 + 5.0)


def test_cached_prefix_tokens_cost_nothing() -> None:
    seq = make_seq(20)
    seq.num_computed_tokens = 16  # 16 tokens came from the prefix cache
    cold = COST.step_time(step_input([ScheduledSeq(make_seq(20), 20)]))
    warm = COST.step_time(step_input([ScheduledSeq(seq, 4)]))
    assert warm < cold
    assert cold - warm == pytest.approx(0.1 * 16)


def test_a_restored_block_costs_its_copy_not_its_prefill() -> None:
    seq = make_seq(20)
    seq.num_computed_tokens = 16  # 16 tokens restored from the host tier this step
    restored = [KVTransfer(True, b, b) for b in range(4)]
    offloaded = [KVTransfer(False, b, b) for b in range(4, 8)]
    plain = step_input([ScheduledSeq(seq, 4)])
    moved = StepInput(plain.seqs, plain.block_size, restored + offloaded)
    assert COST.step_time(moved) - COST.step_time(plain) == pytest.approx(4 * COST.restore_block_s)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("zero", CostModel.zero()),
        ("default", CostModel()),
        ("1,2,3,4", CostModel(1, 2, 3, 4, 0.02)),
        ("1,2,3,4,5", CostModel(1, 2, 3, 4, 5)),
        ("1,2,3,4,5,6", CostModel(1, 2, 3, 4, 5, 6)),
    ],
)
def test_parse(text: str, expected: CostModel) -> None:
    assert CostModel.parse(text) == expected


@pytest.mark.parametrize("text", ["fast", "1,2", "1,2,3,-4", "1,2,3,4,5,6,7"])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="cost model"):
        CostModel.parse(text)


async def test_tokens_are_deterministic_per_prompt_and_seed() -> None:
    runner = SimRunner([1, 2, 3, 4, 5, 6, 7, 8], CostModel.zero(), seed=3)

    async def generate(prompt: list[int]) -> list[int]:
        seq = make_seq(tokens=prompt)
        tokens: list[int] = []
        for _ in range(12):
            (token,) = (
                await runner.execute(
                    step_input([ScheduledSeq(seq, seq.num_tokens - seq.num_computed_tokens)])
                )
            ).tokens
            assert token is not None
            seq.num_computed_tokens = seq.num_tokens
            seq.token_ids.append(token)
            tokens.append(token)
            seq.block_table = []  # the next step's table covers the new token too
        runner.release(seq.seq_id)
        return tokens

    a = await generate([1, 2, 3])
    assert a == await generate([1, 2, 3])
    assert a != await generate([1, 2, 4])
    assert set(a) <= set(range(1, 9))


async def test_lora_residency_is_lru_bounded() -> None:
    runner = SimRunner([1], CostModel.zero(), max_loras=2)
    for name in ("a", "b", "a", "c"):
        await runner.execute(step_input([ScheduledSeq(make_seq(2, lora=name), 2)]))
    assert list(runner.resident_loras) == ["a", "c"]
    assert runner.num_lora_swaps == 3
