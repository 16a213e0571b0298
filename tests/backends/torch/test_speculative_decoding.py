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


def _target(probs: list[float], sampling: SamplingParams) -> torch.Tensor:
    """The distribution vLLM samples from, worked out by hand: temperature, min-p, top-k,
    top-p, renormalised."""
    weights = [p ** (1 / sampling.temperature) for p in probs]
    total = sum(weights)
    weights = [w / total for w in weights]
    likeliest = max(weights)
    kept = [w if w >= sampling.min_p * likeliest else 0.0 for w in weights]
    order = sorted(range(len(kept)), key=lambda i: -kept[i])
    if 0 < sampling.top_k < len(kept):
        for i in order[sampling.top_k :]:
            kept[i] = 0.0
    total = sum(kept)
    kept = [w / total for w in kept]
    mass = 0.0
    for i in order:
        if mass >= sampling.top_p:
            kept[i] = 0.0
        mass += kept[i] if mass < sampling.top_p else 0.0
    total = sum(kept)
    return torch.tensor([w / total for w in kept])


GRID = [
    SamplingParams(temperature=1.0, top_p=0.8),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.3, top_k=3),
    SamplingParams(temperature=1.0, top_k=3, top_p=0.7),
    SamplingParams(temperature=1.0, min_p=0.25),
    SamplingParams(temperature=0.8, min_p=0.1, top_p=0.85),
]


@pytest.mark.parametrize(
    "sampling", GRID, ids=lambda s: f"t{s.temperature}-p{s.top_p}-k{s.top_k}-m{s.min_p}"
)
def test_with_drafts_each_token_follows_the_truncated_distribution(
    sampling: SamplingParams,
) -> None:
    """Whatever is drafted, the token emitted at a drafted position is distributed as plain
    sampling's (the nucleus renormalised: accepted at p(d)/Z, not p(d))."""
    probs = [0.5, 0.3, 0.15, 0.05]
    logits = torch.log(torch.tensor(probs)).expand(2, 4).clone()
    target = _target(probs, sampling)
    sampler = Sampler((), seed=11)
    row = SampleRow(0, sampling, 0)
    trials = 20_000
    plain = torch.zeros(4)
    for _ in range(trials):
        plain[sampler.sample(logits[:1], [row]).tokens[0]] += 1
    assert torch.allclose(plain / trials, target, atol=0.015), (plain / trials, target)
    for draft in (0, 1, 3):
        counts = torch.zeros(4)
        for _ in range(trials):
            accepted, token = sampler.verify(logits, row, [draft])
            counts[accepted[0] if accepted else token] += 1
        assert torch.allclose(counts / trials, target, atol=0.015), (draft, counts / trials, target)
