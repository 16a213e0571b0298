"""The one chained block hash of kvgate: ``h_i = xxh64(data_i, seed=h_{i-1})``.

A block's hash depends on its own bytes and, through its parent, on every block before it, so
equal hashes mean equal prefixes. The engine's block manager keys its prefix cache with it
(over token ids and the LoRA name), the precise prefix index keys the blocks of KV events with
it, and the approximate index chains routing-text characters with it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import xxhash

ROOT = 0x6B766761_74650000  # the chains' default root ("kvgate")

_digest = xxhash.xxh64_intdigest


def hash_block(parent: int, data: bytes) -> int:
    """The hash of one block whose predecessor hashed to ``parent`` (a 64-bit integer)."""
    return _digest(data, parent)


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids as the hash reads them (32-bit native integers)."""
    return array("I", token_ids).tobytes()


def extra_key(lora_name: str | None) -> bytes:
    """The bytes that make a block of an adapter differ from the base model's same tokens."""
    return b"\x00lora:" + lora_name.encode() if lora_name else b""


def token_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    extra: bytes = b"",
    parent: int = ROOT,
    first_block: int = 0,
    max_blocks: int | None = None,
) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` from ``first_block`` on, the chain
    continuing from ``parent`` (the hash of block ``first_block - 1``, or the root)."""
    end = len(token_ids) // block_size
    if max_blocks is not None:
        end = min(end, first_block + max_blocks)
    hashes: list[int] = []
    for i in range(first_block, end):
        data = token_bytes(token_ids[i * block_size : (i + 1) * block_size])
        parent = _digest(data + extra, parent)
        hashes.append(parent)
    return hashes


def text_block_hashes(text: str, block_chars: int, root: str, max_blocks: int) -> list[int]:
    """Chained hashes of ``text`` in blocks of ``block_chars`` characters (a trailing partial
    block included, at most ``max_blocks``), rooted at ``xxh64(root)``; empty if ``text`` is
    shorter than one block."""
    if len(text) < block_chars:
        return []
    data = text[: block_chars * max_blocks].encode()
    previous = _digest(root.encode(), 0)
    hashes: list[int] = []
    for start in range(0, len(data), block_chars):
        previous = _digest(data[start : start + block_chars], previous)
        hashes.append(previous)
    return hashes
