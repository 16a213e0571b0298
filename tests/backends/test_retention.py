"""Retention: blocks kept through a session's pause are evicted after every other free block,
only until their pins expire, within bounds per owner and in all; a pin never fails an
allocation."""

from __future__ import annotations

from backends.engine.block_manager import BlockManager
from backends.engine.retention import Retention
from tests.fakes import make_seq, run_and_free


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def manager(clock: Clock, blocks: int = 6, total: int = 0, per_owner: int = 0) -> BlockManager:
    bm = BlockManager(blocks, 4, max_retained=total or blocks, max_retained_per_owner=per_owner)
    assert bm.retention is not None
    bm.retention.clock = clock
    return bm


def test_a_retained_session_outlives_newer_traffic_until_its_pin_expires() -> None:
    clock = Clock()
    bm = manager(clock)
    session = make_seq(9, start=0)  # two full blocks
    run_and_free(bm, session)
    assert bm.retain(session.block_hashes, 30.0, "tenant-a") == 2
    run_and_free(bm, make_seq(9, start=50))
    run_and_free(bm, make_seq(13, start=100))  # needs four blocks: the other prompt's are taken
    assert run_and_free(bm, make_seq(9, start=0)) == 8 and bm.retained_hit_tokens == 8
    bm.retain(session.block_hashes, 30.0, "tenant-a")  # the session pauses again
    clock.now += 31  # and never comes back in time: its blocks are the first to go now
    run_and_free(bm, make_seq(13, start=150))
    assert run_and_free(bm, make_seq(9, start=0)) == 0


def test_without_a_pin_the_session_is_evicted_first() -> None:
    bm = manager(Clock())
    run_and_free(bm, make_seq(9, start=0))
    run_and_free(bm, make_seq(9, start=50))
    run_and_free(bm, make_seq(13, start=100))
    assert run_and_free(bm, make_seq(9, start=0)) == 0


def test_a_pin_never_fails_an_allocation() -> None:
    bm = manager(Clock(), blocks=4)
    session = make_seq(13, start=0)  # three full blocks and a token: all four blocks
    run_and_free(bm, session)
    assert bm.retain(session.block_hashes, 30.0, "t") == 3
    other = make_seq(16, start=50)  # needs all four blocks: the retained ones are taken
    cached, _ = bm.get_computed_blocks(other)
    assert bm.can_allocate(other, cached, 16)
    bm.allocate(other, cached, 16)
    assert bm.retention is not None and len(bm.retention) == 0  # the taken pins are gone


def test_pins_are_bounded_per_owner_and_in_all() -> None:
    bm = manager(Clock(), blocks=16, total=5, per_owner=3)
    first, second = make_seq(17, start=0), make_seq(17, start=100)  # four full blocks each
    run_and_free(bm, first)
    run_and_free(bm, second)
    assert bm.retain(first.block_hashes, 30.0, "a") == 3  # the leading three: the owner's bound
    assert bm.retain(second.block_hashes, 30.0, "b") == 2  # the rest of the total
    assert bm.retain(first.block_hashes[:2], 60.0, "a") == 2  # extended, not counted again


def test_pins_last_at_most_the_cap_and_expire_in_order() -> None:
    clock = Clock()
    pins = Retention(10, 10, max_ttl=300.0, clock=clock)
    assert pins.pin([1, 2], 10_000.0, "a") == [1, 2]
    pins.pin([2], 500.0, "a")  # capped: no longer than the first
    clock.now += 299
    assert pins.expire() == [] and pins.holds(1)
    clock.now += 2
    assert sorted(pins.expire()) == [1, 2] and len(pins) == 0
    assert not BlockManager(4, 4).retain([1], 5.0, "a")  # no retention configured


def test_a_pin_is_spent_when_its_session_is_back_and_released_when_it_ends() -> None:
    bm = manager(Clock())
    session = make_seq(9, start=0)
    run_and_free(bm, session)
    bm.retain(session.block_hashes, 30.0, "a")
    assert bm.retention is not None and len(bm.retention) == 2
    run_and_free(
        bm, make_seq(9, start=0)
    )  # back: the pins are spent, the blocks are plain cached ones
    assert len(bm.retention) == 0
    bm.retain(session.block_hashes, 30.0, "a")
    bm.release(session.block_hashes)  # its final answer: nothing to keep
    assert len(bm.retention) == 0
    run_and_free(bm, make_seq(9, start=50))
    run_and_free(bm, make_seq(13, start=100))
    assert run_and_free(bm, make_seq(9, start=0)) == 0  # an ordinary LRU victim again
