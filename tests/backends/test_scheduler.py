"""Scheduler: continuous batching, chunked prefill, preemption, LoRA slots, no block leaks."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from backends.engine.sequence import FinishReason, SequenceStatus
from tests.fakes import EOS, make_scheduler, make_seq, sample_all, step


@pytest.mark.parametrize(
    ("prompt_len", "budget", "chunks"),
    [(10, 64, [10]), (10, 4, [4, 4, 2]), (12, 5, [5, 5, 2]), (3, 3, [3])],
)
def test_chunked_prefill_splits_prompt_by_budget(
    prompt_len: int, budget: int, chunks: list[int]
) -> None:
    sch = make_scheduler(max_num_batched_tokens=budget)
    seq = make_seq(prompt_len, max_tokens=2)
    sch.add(seq)
    seen = []
    for _ in chunks:
        scheduled = step(sch)
        seen.append(scheduled[0].num_new_tokens)
    assert seen == chunks
    assert seq.num_output_tokens == 1  # sampled only after the last chunk


def test_without_chunking_a_long_prompt_waits_for_a_whole_budget() -> None:
    sch = make_scheduler(max_num_batched_tokens=64, max_model_len=64, chunked=False)
    a, b = make_seq(40, max_tokens=3), make_seq(40, start=60, max_tokens=3)
    sch.add(a)
    sch.add(b)
    first = step(sch)
    assert [s.seq for s in first] == [a]  # b does not fit in the remaining 24 tokens


def test_decode_and_prefill_mix_in_one_step() -> None:
    sch = make_scheduler()
    a = make_seq(4, max_tokens=5)
    sch.add(a)
    step(sch)
    b = make_seq(6, start=40)
    sch.add(b)
    scheduled = step(sch)
    assert [(s.seq, s.num_new_tokens) for s in scheduled] == [(a, 1), (b, 6)]


def test_max_num_seqs_caps_the_batch() -> None:
    sch = make_scheduler(max_num_seqs=2)
    seqs = [make_seq(4, start=10 * i) for i in range(3)]
    for s in seqs:
        sch.add(s)
    step(sch)
    assert sch.num_running == 2 and sch.num_waiting == 1


@pytest.mark.parametrize(
    ("max_tokens", "tokens", "reason", "outputs"),
    [(3, [7, 7, 7, 7], FinishReason.LENGTH, 3), (5, [7, EOS], FinishReason.STOP, 2)],
)
def test_finish_reasons(
    max_tokens: int, tokens: list[int], reason: FinishReason, outputs: int
) -> None:
    sch = make_scheduler()
    seq = make_seq(4, max_tokens=max_tokens)
    sch.add(seq)
    for token in tokens:
        if seq.is_finished:
            break
        step(sch, token)
    assert seq.finish_reason is reason and seq.num_output_tokens == outputs
    assert sch.block_manager.num_free_blocks == sch.block_manager.num_blocks


def test_prompt_at_context_length_is_rejected() -> None:
    sch = make_scheduler(max_model_len=16)
    with pytest.raises(ValueError, match="context"):
        sch.add(make_seq(16))


def test_context_larger_than_kv_cache_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="KV cache"):
        make_scheduler(num_blocks=2, block_size=4, max_model_len=64)


def test_preemption_takes_newest_lowest_priority_and_resumes() -> None:
    # 4 blocks of 4 tokens. Two sequences of 7 tokens take 2 blocks each; the first decode
    # step that crosses a block boundary must preempt.
    sch = make_scheduler(num_blocks=4, block_size=4, max_model_len=16)
    old = make_seq(7, max_tokens=6, arrival=1.0)
    new = make_seq(7, start=50, max_tokens=6, arrival=2.0)
    sch.add(old)
    sch.add(new)
    step(sch)  # both prefilled: 7 tokens + 1 sampled = 8 tokens, 2 blocks each
    step(sch)  # the 8th token's KV still fits in 2 blocks; the 9th needs a third
    out = sch.schedule()
    assert out.preempted == [new]
    assert new.status is SequenceStatus.WAITING and new.num_computed_tokens == 0
    assert new.block_table == [] and sch.stats.num_preemptions == 1
    sch.postprocess(out, sample_all(out.scheduled))
    while not old.is_finished:
        step(sch)
    while not new.is_finished:
        step(sch)
    assert new.num_output_tokens == 6  # resumed by recompute, outputs kept
    assert sch.block_manager.num_free_blocks == 4


def test_priority_protects_urgent_requests_from_preemption() -> None:
    sch = make_scheduler(num_blocks=4, block_size=4, max_model_len=16)
    urgent = make_seq(7, max_tokens=6, priority=0, arrival=2.0)
    lazy = make_seq(7, start=50, max_tokens=6, priority=5, arrival=1.0)
    sch.add(lazy)
    sch.add(urgent)
    step(sch)
    step(sch)
    out = sch.schedule()
    assert out.preempted == [lazy]


def test_lora_slots_limit_distinct_adapters_in_a_batch() -> None:
    sch = make_scheduler(max_loras=1)
    a, b, c = make_seq(4, lora="a"), make_seq(4, start=20, lora="b"), make_seq(4, start=40)
    for s in (a, b, c):
        sch.add(s)
    scheduled = {s.seq for s in step(sch)}
    assert scheduled == {a, c}  # b waits for a slot; the base-model request is not blocked
    while not a.is_finished:
        step(sch)
    step(sch)
    assert b.status is SequenceStatus.RUNNING


def test_abort_frees_blocks_in_both_queues() -> None:
    sch = make_scheduler(max_num_seqs=1)
    running, waiting = make_seq(9), make_seq(9, start=30)
    sch.add(running)
    sch.add(waiting)
    step(sch)
    sch.abort(running)
    sch.abort(waiting)
    assert running.finish_reason is FinishReason.ABORT and waiting.is_finished
    assert sch.num_running == sch.num_waiting == 0
    assert sch.block_manager.num_free_blocks == sch.block_manager.num_blocks
    sch.abort(running)  # idempotent


def test_prefix_hits_are_counted_in_tokens() -> None:
    sch = make_scheduler()
    first = make_seq(12, max_tokens=1)
    sch.add(first)
    step(sch)
    second = make_seq(12, max_tokens=1)
    sch.add(second)
    step(sch)
    assert sch.stats.prefix_cache_queries == 24
    assert sch.stats.prefix_cache_hits == 8
    assert second.num_cached_tokens == 8


class SchedulerMachine(RuleBasedStateMachine):
    """Random adds, steps and aborts never leak blocks nor drive a ref count negative."""

    def __init__(self) -> None:
        super().__init__()
        self.sch = make_scheduler(
            num_blocks=12,
            block_size=4,
            max_num_seqs=4,
            max_num_batched_tokens=16,
            max_model_len=40,
            max_loras=2,
        )
        self.live: list = []  # type: ignore[type-arg]

    @rule(
        length=st.integers(1, 30),
        prefix=st.sampled_from([0, 100, 200]),
        max_tokens=st.integers(1, 9),
        priority=st.integers(0, 2),
        lora=st.sampled_from([None, None, "x", "y", "z"]),
    )
    def add(
        self, length: int, prefix: int, max_tokens: int, priority: int, lora: str | None
    ) -> None:
        seq = make_seq(length, start=prefix, max_tokens=max_tokens, priority=priority, lora=lora)
        self.sch.add(seq)
        self.live.append(seq)

    @rule(token=st.sampled_from([7, 7, 7, EOS]))
    def step(self, token: int) -> None:
        step(self.sch, token)

    @precondition(lambda self: bool(self.live))
    @rule(index=st.integers(0, 100))
    def abort(self, index: int) -> None:
        self.sch.abort(self.live[index % len(self.live)])

    @invariant()
    def accounting_holds(self) -> None:
        bm = self.sch.block_manager
        held: dict[int, int] = {}
        for seq in self.sch.running:
            for block in seq.block_table:
                held[block] = held.get(block, 0) + 1
        for owned in bm.blocks:
            assert owned.ref_count >= 0
            assert owned.ref_count == held.get(owned.block_id, 0)
        assert bm.num_free_blocks == sum(1 for b in bm.blocks if b.ref_count == 0)
        for entry in self.sch.waiting:
            assert entry[1].block_table == []

    def teardown(self) -> None:
        for _ in range(500):
            if not self.sch.has_work:
                break
            step(self.sch)
        assert not self.sch.has_work, "every request finishes once new arrivals stop"
        bm = self.sch.block_manager
        assert bm.num_free_blocks == bm.num_blocks


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
