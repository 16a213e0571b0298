"""A prefill worker's held requests: leases, renewals, releases, and no expiry under a pull."""

from __future__ import annotations

import pytest

from backends.pd.held_blocks import HeldBlocks
from tests.fakes import make_seq


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def held_blocks() -> tuple[HeldBlocks, Clock, list[int]]:
    clock, freed = Clock(), []
    held = HeldBlocks(lambda seq: freed.append(seq.seq_id), lease_seconds=2.0, clock=clock)
    return held, clock, freed


def test_a_lapsed_lease_frees_the_blocks_once_and_is_counted() -> None:
    held, clock, freed = held_blocks()
    expired: list[int] = []
    held.on_expired = expired.append
    seq = make_seq(40)
    seq.block_table = [3, 4, 5]
    held.hold("r1", seq)
    assert held.num_blocks == 3 and len(held) == 1
    clock.now = 1.9
    assert held.expire() == 0
    clock.now = 2.0
    assert held.expire() == 1 and freed == [seq.seq_id] and expired == [1]
    assert held.expire() == 0 and held.num_blocks == 0 and held.num_expired == 1
    assert not held.renew("r1") and not held.release("r1")


def test_heartbeats_renew_and_a_pull_in_progress_never_expires() -> None:
    held, clock, freed = held_blocks()
    entry = held.hold("r1", make_seq(8))
    for step in range(1, 5):
        clock.now = step * 1.5
        assert held.renew("r1")
        assert held.expire() == 0
    entry.pulling = True
    clock.now = 100.0
    assert held.expire() == 0 and not freed
    entry.pulling = False
    assert held.expire() == 1


def test_release_frees_at_once_and_a_lease_must_be_positive() -> None:
    held, _, freed = held_blocks()
    seqs = [make_seq(8), make_seq(8)]
    for number, seq in enumerate(seqs):
        held.hold(f"r{number}", seq)
    assert held.release("r0") and freed == [seqs[0].seq_id]
    held.release_all()
    assert freed == [s.seq_id for s in seqs] and len(held) == 0
    with pytest.raises(ValueError, match="positive"):
        HeldBlocks(lambda seq: None, lease_seconds=0)
