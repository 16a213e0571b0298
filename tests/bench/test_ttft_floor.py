"""The routing benchmark's TTFT floor: each request costed alone on an idle engine that holds
what an ideal router could have cached for it."""

from __future__ import annotations

import pytest

from backends.runners.sim_runner import CostModel
from bench.ttft_floor import idle_ttft_ms
from loadtest.workloads.reuse_oracle import cacheable_per_prompt, cacheable_tokens

COST = CostModel(step_s=0.004, prefill_token_s=0.001, decode_seq_s=0.0, kv_read_token_s=0.0001)


def test_only_leading_blocks_an_earlier_prompt_had_count_as_cached() -> None:
    shared = list(range(32))
    prompts = [shared + [100] * 8, shared + [200] * 8, [7] * 16 + shared, shared + [100] * 20]
    # the first is new; the second shares 2 blocks; the third none (same blocks, other chain);
    # the fourth the first's 2 blocks and not its tail (8 tokens, never a full block)
    assert cacheable_per_prompt(prompts, 16) == [0, 32, 0, 32]
    assert cacheable_tokens(prompts, 16) == 64


def test_a_prompt_costs_one_prefill_step_of_its_uncached_tokens() -> None:
    prompts = [list(range(40)), list(range(40))]
    # 4 ms a step + 1 ms per uncached token + 0.1 ms per token read; the second has 32 cached
    assert idle_ttft_ms(prompts, cacheable_per_prompt(prompts, 16), COST) == pytest.approx(
        [4 + 40 + 4, 4 + 8 + 4]
    )
