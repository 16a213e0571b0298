"""Speculative decoding without torch: n-gram prompt lookup, its configuration, and the real
engine (scheduler, block manager, step building) over a runner whose next token follows a
known rule — drafts it agrees with are kept, the output is the one without drafts, fewer steps
compute it, nothing is emitted past max_tokens or a stop token, and no block is leaked."""

from __future__ import annotations

import asyncio

import pytest

from backends.engine.build import EngineConfig, build_engine
from backends.engine.engine import AsyncEngine, RequestStream
from backends.engine.scheduler import SchedulerConfig
from backends.engine.sequence import FinishReason, SamplingParams
from backends.engine.speculation import SpeculativeConfig, propose
from backends.engine.step import StepInput, StepOutput
from backends.runners.sim_runner import CostModel, SimRunner

CYCLE = 7  # the rule runner's next token after t is (t + 1) % CYCLE


@pytest.mark.parametrize(
    ("tokens", "config", "limit", "drafts"),
    [
        ([1, 2, 3, 4, 9, 1, 2, 3], SpeculativeConfig(3, 3, 1), 5, [4, 9, 1]),
        ([1, 2, 3, 4, 9, 1, 2, 3], SpeculativeConfig(3, 3, 1), 2, [4, 9]),  # the limit
        ([5, 6, 7], SpeculativeConfig(3, 3, 1), 5, []),  # 7 never came before
        # the longest match wins over a later, shorter one: [2, 3] after 1 2 3, not [8]
        ([1, 2, 3, 8, 5, 3, 8, 0, 1, 2, 3], SpeculativeConfig(2, 3, 1), 9, [8, 5]),
        # of equally long matches, the earliest, as vLLM's proposer (more follows it)
        ([4, 1, 4, 2, 4], SpeculativeConfig(1, 1, 1), 9, [1]),
        ([4, 1, 4, 2, 4], SpeculativeConfig(4, 1, 1), 9, [1, 4, 2, 4]),
        ([3, 1, 2, 3], SpeculativeConfig(4, 3, 2), 9, []),  # a 1-token match is too short
        # only what followed the match, never past the sequence's end (vLLM's proposer)
        ([5, 1, 2, 1, 2], SpeculativeConfig(5, 2, 2), 9, [1, 2]),
    ],
)
def test_prompt_lookup_proposes_what_followed_the_longest_earliest_match(
    tokens: list[int], config: SpeculativeConfig, limit: int, drafts: list[int]
) -> None:
    assert propose(tokens, config, limit) == drafts


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ("[1]", "must be a JSON object"),
        ('{"method": "eagle"}', "'eagle' is not supported"),
        ('{"num_speculative_tokens": 0}', r"\[1, 32\]"),
        ('{"prompt_lookup_min": 5, "prompt_lookup_max": 2}', "prompt_lookup_min"),
        ('{"model": "x"}', "unknown --speculative-config keys: model"),
        ('{"num_speculative_tokens": "4"}', "must be integers"),
    ],
)
def test_a_bad_speculative_config_is_refused_clearly(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.parse(text)


class RuleRunner(SimRunner):
    """A runner whose model says ``(t + 1) % CYCLE`` after token ``t``, and ``stop`` after
    ``stop_after`` when set: drafts of a cycle are right, so they are kept."""

    def __init__(self, stop_after: int | None = None, stop: int = 99) -> None:
        super().__init__(range(100), CostModel.zero())
        self.stop_after, self.stop = stop_after, stop

    def next_token(self, token: int) -> int:
        return self.stop if token == self.stop_after else (token + 1) % CYCLE

    async def execute(self, step: StepInput) -> StepOutput:
        tokens: list[int | None] = []
        accepted: list[list[int] | None] = []
        for seq in step.seqs:
            rows = seq.input_ids[len(seq.input_ids) - 1 - seq.num_draft_tokens :]
            drafts = rows[1:]
            kept = 0
            while kept < len(drafts) and self.next_token(rows[kept]) == drafts[kept]:
                kept += 1
            tokens.append(self.next_token(rows[kept]) if seq.do_sample else None)
            accepted.append(drafts[:kept] if seq.num_draft_tokens else None)
        return StepOutput(tokens, accepted=accepted)


def engine(runner: SimRunner, speculative: SpeculativeConfig | None) -> AsyncEngine:
    config = SchedulerConfig(max_model_len=256, eos_token_ids=(99,), speculative=speculative)
    return build_engine(EngineConfig(config, num_blocks=64, block_size=4), runner)


Output = list[tuple[list[int], FinishReason | None]]


async def generate(
    engine: AsyncEngine, prompts: list[list[int]], sampling: SamplingParams
) -> Output:
    """Each prompt's generated tokens and finish reason, all submitted at once."""
    engine.start()
    try:
        streams = [engine.add_request(prompt, sampling) for prompt in prompts]

        async def drain(stream: RequestStream) -> tuple[list[int], FinishReason | None]:
            tokens: list[int] = []
            while batch := await stream.next_tokens():
                tokens.extend(batch)
            return tokens, stream.finish_reason

        return list(await asyncio.wait_for(asyncio.gather(*(drain(s) for s in streams)), 10))
    finally:
        await engine.stop()


PROMPTS = [[0, 1, 2, 3, 4, 5, 6, 0, 1], [3, 4, 5], [6, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2]]


def test_kept_drafts_give_the_same_output_in_fewer_steps() -> None:
    sampling = SamplingParams(max_tokens=30, temperature=0.0)
    plain_engine = engine(RuleRunner(), None)
    plain = asyncio.run(generate(plain_engine, PROMPTS, sampling))
    spec_engine = engine(RuleRunner(), SpeculativeConfig(4, 3, 1))
    drafted = asyncio.run(generate(spec_engine, PROMPTS, sampling))
    assert drafted == plain
    assert all(len(tokens) == 30 for tokens, _ in drafted)
    stats = spec_engine.scheduler.speculation
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0  # the rule never errs
    assert stats.accepted_per_position[0] == stats.num_drafts
    assert spec_engine.num_steps < plain_engine.num_steps / 2
    blocks = spec_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks  # every block back
    assert spec_engine.scheduler.stats.generation_tokens == 90


def test_a_stop_token_among_kept_drafts_ends_the_output_there() -> None:
    # the prompt holds 2 -> 99: the lookup drafts 3, 4, ..., and the runner stops after 4
    sampling = SamplingParams(max_tokens=30, temperature=0.0)
    prompt = [[1, 2, 3, 4, 5, 6, 0, 1, 2]]
    plain = asyncio.run(generate(engine(RuleRunner(stop_after=4), None), prompt, sampling))
    spec = engine(RuleRunner(stop_after=4), SpeculativeConfig(4, 3, 1))
    drafted = asyncio.run(generate(spec, prompt, sampling))
    assert drafted == plain == [([3, 4, 99], FinishReason.STOP)]


def test_no_draft_goes_past_max_tokens_or_to_a_request_asking_for_logprobs() -> None:
    spec = engine(RuleRunner(), SpeculativeConfig(8, 3, 1))
    (out,) = asyncio.run(generate(spec, PROMPTS[:1], SamplingParams(max_tokens=5)))
    assert out[0] == [2, 3, 4, 5, 6]
    assert spec.scheduler.speculation.num_draft_tokens <= 4  # 5 tokens: one sampled at least
    logprobs = engine(RuleRunner(), SpeculativeConfig(4, 3, 1))
    asyncio.run(generate(logprobs, PROMPTS[:1], SamplingParams(max_tokens=9, logprobs=True)))
    assert logprobs.scheduler.speculation.num_drafts == 0


def test_the_simulated_runner_verifies_drafts_as_it_samples() -> None:
    sampling = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    prompts = [list(range(10, 30)) * 3]
    plain = asyncio.run(
        generate(engine(SimRunner(range(100), CostModel.zero()), None), prompts, sampling)
    )
    spec = engine(SimRunner(range(100), CostModel.zero()), SpeculativeConfig(4, 3, 1))
    assert asyncio.run(generate(spec, prompts, sampling)) == plain
    assert spec.scheduler.speculation.num_drafts > 0
