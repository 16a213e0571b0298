"""The typed step input the engine hands its model runner."""

from __future__ import annotations

import pytest

from backends.engine.step import ScheduledSeq, build_step
from tests.fakes import make_scheduler, make_seq, step


def test_prefill_chunk_then_decode_slots_follow_the_block_table() -> None:
    seq = make_seq(6)
    seq.block_table = [7, 2]  # block size 4: positions 0-3 in block 7, 4-7 in block 2
    first = build_step([ScheduledSeq(seq, 5)], 4).seqs[0]
    assert first.input_ids == seq.token_ids[:5] and first.start_position == 0
    assert first.slot_mapping == [28, 29, 30, 31, 8]
    assert not first.do_sample and not first.is_decode
    seq.num_computed_tokens = 5
    rest = build_step([ScheduledSeq(seq, 1)], 4).seqs[0]
    # one token over a computed context: shaped as a decode, whether or not it is a prompt token
    assert rest.slot_mapping == [9] and rest.do_sample and rest.is_decode
    seq.token_ids.append(99)
    seq.num_computed_tokens = 6
    decode = build_step([ScheduledSeq(seq, 1)], 4).seqs[0]
    assert decode.input_ids == [99] and decode.positions == range(6, 7)
    assert decode.slot_mapping == [10] and decode.is_decode and decode.num_context_tokens == 7


def test_a_table_too_short_for_the_tokens_is_an_error() -> None:
    seq = make_seq(6)
    seq.block_table = [3]
    with pytest.raises(ValueError, match="1 blocks cannot hold 6 tokens"):
        build_step([ScheduledSeq(seq, 6)], 4)


def test_steps_of_mixed_lengths_from_the_scheduler() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=64)
    scheduler.add(make_seq(9, start=0))
    scheduler.add(make_seq(3, start=100, lora="ad"))
    out = scheduler.schedule()
    built = build_step(out.scheduled, 4)
    long, short = built.seqs
    assert [len(s.input_ids) for s in built.seqs] == [9, 3]
    assert len(long.block_table) == 3 and len(short.block_table) == 1
    assert not set(long.slot_mapping) & set(short.slot_mapping)
    assert built.num_prefill_tokens == 12 and built.num_decode_seqs == 0
    assert built.lora_names == {"ad"}
    scheduler.postprocess(out, [7, 7])
    decode = build_step(step(scheduler) and scheduler.schedule().scheduled, 4)
    assert decode.num_decode_seqs == 2
