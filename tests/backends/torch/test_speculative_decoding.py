"""Speculative decoding in the torch runner: drafts computed in one forward pass through the
paged KV cache and checked by the sampler — greedy output token for token the one without
drafts, transformers' own; sampled output distributed as the model's (rejection sampling)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backends.engine.sequence import SamplingParams
from backends.engine.speculation import SpeculativeConfig
from backends.runners.sampler import Sampler, SampleRow
from tests.backends.torch.conftest import hf_greedy
from tests.backends.torch.helpers import collect, greedy, make_engine, make_runner

SPECULATIVE = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=3)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
async def test_greedy_output_with_drafts_is_the_output_without(
    family: str, model_folders: dict[str, Path], hf_models: dict[str, object]
) -> None:
    runner = make_runner(model_folders[family])
    phrase = list(range(50, 62))
    prompts = [phrase * 4, list(range(100, 140)), [7, 8, 9] * 10 + phrase]
    requests: list[tuple[list[int], SamplingParams, str | None]] = [
        (prompt, greedy(48), None) for prompt in prompts
    ]
    plain, drafted = make_engine(runner), make_engine(runner, speculative=SPECULATIVE)
    outputs = []
    for engine in (plain, drafted):
        engine.start()
        try:
            outputs.append(await collect(engine, requests))
        finally:
            await engine.stop()
    assert outputs[1] == outputs[0]
    assert outputs[1][0] == hf_greedy(hf_models[family], prompts[0], 48)
    stats = drafted.scheduler.speculation
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0
    assert drafted.num_steps < plain.num_steps


def test_a_kept_draft_is_the_argmax_and_the_next_token_follows_the_last_kept() -> None:
    logits = torch.full((4, 10), -5.0)
    for number, best in enumerate([3, 6, 2, 9]):
        logits[number, best] = 5.0
    row = SampleRow(0, SamplingParams(temperature=0.0), 0)
    assert Sampler(()).verify(logits, row, [3, 6, 2]) == ([3, 6, 2], 9)
    assert Sampler(()).verify(logits, row, [3, 1, 2]) == ([3], 6)
    assert Sampler(()).verify(logits, row, [0, 6, 2]) == ([], 3)


def test_min_tokens_masks_eos_at_each_drafted_position() -> None:
    logits = torch.zeros(3, 6)
    logits[:, 2] = 9.0  # EOS is each row's favourite
    logits[:, 4] = 8.0
    sampling = SamplingParams(temperature=0.0, min_tokens=2)
    row = SampleRow(0, sampling, 0)  # rows 0 and 1 are before min_tokens, row 2 is not
    assert Sampler(eos_token_ids=(2,)).verify(logits, row, [4, 4]) == ([4, 4], 2)


def test_sampled_tokens_with_drafts_are_distributed_as_the_model_says() -> None:
    # one drafted position: the token emitted there must follow p whatever the draft
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = torch.log(probs).expand(2, 4).clone()
    sampler = Sampler((), seed=3)
    row = SampleRow(0, SamplingParams(temperature=1.0), 0)
    trials = 20_000
    for draft in (1, 3):
        counts = torch.zeros(4)
        kept = 0
        for _ in range(trials):
            accepted, token = sampler.verify(logits, row, [draft])
            first = accepted[0] if accepted else token
            counts[first] += 1
            kept += len(accepted)
        assert torch.allclose(counts / trials, probs, atol=0.015), (draft, counts / trials)
        assert kept / trials == pytest.approx(float(probs[draft]), abs=0.015)
