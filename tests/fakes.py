"""Builders shared by the tests (GIE's MakePod idea): small engines, sequences, scripted runners."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from backends.engine.block_manager import BlockManager
from backends.engine.scheduler import Scheduler, SchedulerConfig
from backends.engine.sequence import SamplingParams, Sequence
from backends.engine.step import ScheduledSeq, StepInput, build_step

EOS = 256


def make_seq(
    num_tokens: int = 8,
    *,
    start: int = 0,
    max_tokens: int = 4,
    priority: int = 0,
    lora: str | None = None,
    arrival: float | None = None,
    tokens: list[int] | None = None,
) -> Sequence:
    """A sequence whose prompt is ``tokens`` or ``start, start+1, ...`` (``num_tokens`` long)."""
    prompt = tokens if tokens is not None else [(start + i) % 250 for i in range(num_tokens)]
    seq = Sequence(prompt, SamplingParams(max_tokens=max_tokens), lora_name=lora, priority=priority)
    if arrival is not None:
        seq.arrival_time = arrival
    return seq


def run_and_free(bm: BlockManager, seq: Sequence) -> int:
    """Admit ``seq`` whole, then free it (its full blocks stay cached); its cached tokens."""
    cached, num_cached = bm.get_computed_blocks(seq)
    assert bm.can_allocate(seq, cached, seq.num_tokens - num_cached)
    bm.allocate(seq, cached, seq.num_tokens - num_cached)
    bm.free(seq)
    return num_cached


def make_scheduler(
    num_blocks: int = 16,
    block_size: int = 4,
    *,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 64,
    chunked: bool = True,
    max_loras: int = 1,
    record_events: bool = False,
) -> Scheduler:
    blocks = BlockManager(num_blocks, block_size, record_events=record_events)
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        max_loras=max_loras,
        eos_token_ids=(EOS,),
    )
    return Scheduler(config, blocks)


def sample_all(batch: list[ScheduledSeq], token: int = 7) -> list[int | None]:
    """What a runner returns: ``token`` for every item that samples."""
    return [token if item.samples else None for item in batch]


def step_input(batch: list[ScheduledSeq], block_size: int = 4) -> StepInput:
    """The runner's input for ``batch``; sequences without blocks get a table of distinct
    blocks covering their tokens (as if the block manager had allocated them)."""
    next_block = 0
    for item in batch:
        if not item.seq.block_table:
            needed = -(-(item.seq.num_computed_tokens + item.num_new_tokens) // block_size)
            item.seq.block_table = list(range(next_block, next_block + needed))
            next_block += needed
    return build_step(batch, block_size)


def step(scheduler: Scheduler, token: int = 7) -> list[ScheduledSeq]:
    """One schedule + postprocess round; returns what was scheduled."""
    out = scheduler.schedule()
    scheduler.postprocess(out, sample_all(out.scheduled, token))
    return out.scheduled


class ManualClock:
    """A clock the test moves by hand (``clock.now += 60``)."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)
CLOSE_AFTER_TEST: list[Callable[[], None]] = []


def close_after_test(thing: C) -> C:
    """``thing``, closed when the running test ends (the shared conftest's ``_close_after``):
    for helpers that build what a test does not close itself."""
    CLOSE_AFTER_TEST.append(thing.close)
    return thing
