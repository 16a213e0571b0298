"""Approximate prefix index and scorer: hashing, matching, LRU eviction, removal, oracle."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.datalayer.indexes.approximate import ApproximatePrefixIndex, prefix_hashes
from epp.scheduling.handle import PluginHandle
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from tests.epp.builders import make_endpoint, make_request

A, B = "10.0.0.1:8000", "10.0.0.2:8000"


def test_hashes_are_chained_and_model_scoped() -> None:
    text = "x" * 64 + "y" * 64 + "z" * 10
    hashes = prefix_hashes("m", text, 64, 256)
    assert len(hashes) == 3  # the trailing partial block counts
    assert prefix_hashes("m", "x" * 64 + "q" * 64, 64, 256)[0] == hashes[0]
    assert prefix_hashes("m", "x" * 64 + "q" * 64, 64, 256)[1] != hashes[1]
    assert prefix_hashes("other", text, 64, 256)[0] != hashes[0]
    assert prefix_hashes("m", "short", 64, 256) == []
    assert len(prefix_hashes("m", "a" * 10_000, 64, 4)) == 4


def test_match_counts_leading_blocks_only() -> None:
    index = ApproximatePrefixIndex()
    index.record(A, [1, 2, 3])
    index.record(B, [1, 9])
    assert index.match([1, 2, 3, 4], [A, B, "c"]) == {A: 3, B: 1, "c": 0}
    assert index.match([1, 2], [A]) == {A: 2}
    assert index.match([7, 1], [A, B]) == {A: 0, B: 0}
    assert index.match([], [A]) == {A: 0}


def test_lru_evicts_tails_before_heads_and_removal() -> None:
    index = ApproximatePrefixIndex()
    index.record(A, [1, 2, 3], capacity=3)  # recorded tail first: 3 is the oldest
    index.record(A, [1, 4], capacity=3)  # a sibling chain: 3 goes, the shared head stays
    assert index.match([1, 2, 3], [A]) == {A: 2} and index.match([1, 4], [A]) == {A: 2}
    assert index.blocks_of(A) == 3
    index.remove(A)
    assert index.blocks_of(A) == 0 and len(index) == 0


def test_scorer_reads_what_its_index_learned() -> None:
    params = {"block_size_tokens": 4, "chars_per_token": 1}
    scorer = PrefixCacheScorer.from_config("prefix", params, PluginHandle())
    a, b = make_endpoint(A), make_endpoint(B)
    first = make_request("abcdefghijkl", request_id="r1")  # 3 blocks of 4 chars
    assert scorer.score(first, [a, b]) == {A: 0.0, B: 0.0}
    scorer.index.learn(first, a)
    second = make_request("abcdefgh----", request_id="r2")
    assert scorer.score(second, [a, b]) == {A: 2 / 3, B: 0.0}


def test_the_index_tells_each_endpoints_uncached_tokens_and_the_prompts_holders() -> None:
    params = {"block_size_tokens": 4, "chars_per_token": 1, "measure_chars_per_token": False}
    scorer = PrefixCacheScorer.from_config("prefix", params, PluginHandle())
    a, b, c = make_endpoint(A), make_endpoint(B), make_endpoint("c:1")
    scorer.index.learn(make_request("abcdefghijkl", request_id="r1"), a)
    scorer.index.learn(make_request("abcdXXXXXXXX", request_id="r2"), b)
    second = make_request("abcdefgh----", request_id="r3")
    assert scorer.index.uncached_tokens_each(second, [a, b, c]) == [4, 8, 12]
    assert [scorer.index.uncached_tokens(second, e) for e in (a, b, c)] == [4, 8, 12]
    assert scorer.index.holders(second, 5) == [A, B] and scorer.index.holders(second, 1) == [A]


def test_a_reused_request_id_does_not_reuse_the_earlier_prompts_blocks() -> None:
    # over ext_proc the id is the client's x-request-id: any client can send one twice
    params = {"block_size_tokens": 4, "chars_per_token": 1}
    scorer = PrefixCacheScorer.from_config("prefix", params, PluginHandle())
    a, b = make_endpoint(A), make_endpoint(B)
    first = make_request("abcdefghijkl", request_id="same")
    scorer.score(first, [a, b])
    scorer.index.learn(first, a)
    unrelated = make_request("zyxwvutsrqpo", request_id="same")
    assert scorer.score(unrelated, [a, b]) == {A: 0.0, B: 0.0}
    scorer.index.learn(unrelated, b)
    assert scorer.score(make_request("zyxwvutsrqpo", request_id="x"), [a, b]) == {A: 0.0, B: 1.0}


class FixedIndex:
    """An index whose matches are given (the scorer's arithmetic under test)."""

    def __init__(self, matches: dict[str, int], num_keys: int, min_match_blocks: int) -> None:
        from epp.datalayer.indexes.prefix_index import PrefixIndexParams

        self.matches, self.num_keys = matches, num_keys
        self.params = PrefixIndexParams(min_match_blocks=min_match_blocks)

    def keys(self, request: object) -> list[int]:
        return list(range(self.num_keys))

    def match(self, keys: list[int], addresses: list[str]) -> dict[str, int]:
        return {a: self.matches.get(a, 0) for a in addresses}


@pytest.mark.parametrize(
    ("case", "matches", "num_keys", "min_blocks", "expected"),
    [
        (
            "a template's first block held by the busy half",
            {A: 1, B: 1},
            8,
            2,
            {A: 0, B: 0, "c:1": 0},
        ),
        ("a useful match on one endpoint", {A: 6}, 8, 2, {A: 6 / 8, B: 0, "c:1": 0}),
        (
            "blocks every candidate holds count for none",
            {A: 5, B: 2, "c:1": 2},
            8,
            2,
            {A: 3 / 6, B: 0, "c:1": 0},
        ),
        (
            "all hold the whole prefix: load decides",
            {A: 8, B: 8, "c:1": 8},
            8,
            2,
            {A: 0, B: 0, "c:1": 0},
        ),
        (
            "one distinguishing block is below the minimum",
            {A: 3, B: 2, "c:1": 2},
            8,
            2,
            {A: 0, B: 0, "c:1": 0},
        ),
        (
            "a minimum of 1 lets one block count",
            {A: 3, B: 2, "c:1": 2},
            8,
            1,
            {A: 1 / 6, B: 0, "c:1": 0},
        ),
    ],
)
def test_prefix_scores_count_only_distinguishing_blocks(
    case: str, matches: dict[str, int], num_keys: int, min_blocks: int, expected: dict[str, float]
) -> None:
    scorer = PrefixCacheScorer("prefix", FixedIndex(matches, num_keys, min_blocks))  # type: ignore[arg-type]
    endpoints = [make_endpoint(a) for a in (A, B, "c:1")]
    assert scorer.score(make_request("x"), endpoints) == pytest.approx(expected), case


def chain(path: list[int]) -> list[int]:
    """Block ids of a chain: block i stands for the whole prefix path[: i + 1] (as chained
    hashes do), so two chains share exactly their common leading blocks."""
    return [hash(tuple(path[: i + 1])) for i in range(len(path))]


@settings(max_examples=120, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([A, B, "c:1"]), st.lists(st.integers(0, 2), min_size=1, max_size=6)
        ),
        max_size=25,
    ),
    st.lists(st.integers(0, 2), min_size=1, max_size=6),
    st.integers(1, 8),
)
def test_index_agrees_with_a_brute_force_oracle(
    records: list[tuple[str, list[int]]], query: list[int], capacity: int
) -> None:
    """Per endpoint an LRU list, touched tail first; the depth is a walk over the query."""
    index = ApproximatePrefixIndex()
    held: dict[str, list[int]] = {}
    for address, path in records:
        blocks = chain(path)
        index.record(address, blocks, capacity=capacity)
        lru = held.setdefault(address, [])
        for block in reversed(blocks):
            if block in lru:
                lru.remove(block)
            lru.append(block)
        del lru[:-capacity]
    expected = {}
    for address in (A, B, "c:1"):
        have = set(held.get(address, []))
        depth = 0
        for block in chain(query):
            if block not in have:
                break
            depth += 1
        expected[address] = depth
    assert index.match(chain(query), [A, B, "c:1"]) == expected
    assert index.held(chain(query)) == {a: depth for a, depth in expected.items() if depth}
