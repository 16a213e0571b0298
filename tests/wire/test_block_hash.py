"""kvgate's one chained block hash, as the engine, the precise and the approximate index use it."""

from __future__ import annotations

from backends.engine.block_manager import hash_block as engine_block_hash
from epp.datalayer.indexes.approximate import prefix_hashes
from epp.datalayer.indexes.precise import block_keys
from kvgate.wire.block_hash import (
    ROOT,
    extra_key,
    hash_block,
    text_block_hashes,
    token_block_hashes,
    token_bytes,
)

TOKENS = list(range(100, 116))


def test_chain_depends_on_everything_before() -> None:
    hashes = token_block_hashes(TOKENS, 4)
    assert len(hashes) == 4 and len(set(hashes)) == 4
    changed = token_block_hashes([0, *TOKENS[1:]], 4)
    assert all(a != b for a, b in zip(hashes, changed, strict=True))
    same_head = token_block_hashes([*TOKENS[:8], 0, 0, 0, 0], 4)
    assert same_head[:2] == hashes[:2] and same_head[2] != hashes[2]


def test_a_chain_continues_from_its_parent() -> None:
    hashes = token_block_hashes(TOKENS, 4)
    assert token_block_hashes(TOKENS, 4, parent=hashes[1], first_block=2) == hashes[2:]
    assert token_block_hashes(TOKENS, 4, max_blocks=2) == hashes[:2]
    assert token_block_hashes(TOKENS[:3], 4) == []


def test_adapter_blocks_differ_from_the_base_model() -> None:
    assert token_block_hashes(TOKENS, 4, extra=extra_key("sql")) != token_block_hashes(TOKENS, 4)
    assert extra_key(None) == b""


def test_every_user_is_the_same_hash() -> None:
    first = hash_block(ROOT, token_bytes(TOKENS[:4]))
    assert block_keys(TOKENS, 4)[0] == first
    assert engine_block_hash(None, TOKENS[:4], None, 0) == first
    assert engine_block_hash(first, TOKENS[4:8], "ad", 0) == hash_block(
        first, token_bytes(TOKENS[4:8]) + extra_key("ad")
    )
    assert prefix_hashes("m", "ab" * 8, 4, 10) == text_block_hashes("ab" * 8, 4, "m", 10)
    assert text_block_hashes("abcdefgh", 4, "m", 10)[0] == hash_block(hash_block(0, b"m"), b"abcd")
