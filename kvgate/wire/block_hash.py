"""The one chained block hash of kvgate: ``h_i = xxh64(data_i, seed=h_{i-1})``.

A block's hash depends on its own bytes and, through its parent, on every block before it, so
equal hashes mean equal prefixes. The engine's block manager keys its prefix cache with it
(over token ids and the LoRA name), the precise prefix index keys the blocks of KV events with
it, and the approximate index chains routing-text characters with it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import msgpack
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


def extras_key(extras: Sequence[object] | None) -> bytes:
    """The bytes of one block's published extra keys (vLLM's per-block ``extra_keys``: LoRA
    name, multimodal pairs, cache salt), canonical on both ends; empty for none."""
    if not extras:
        return b""
    packed: bytes = msgpack.packb([list(v) if isinstance(v, tuple) else v for v in extras])
    return b"\x00extra:" + packed


def request_extras(lora_name: str | None, cache_salt: str | None, blocks: int) -> list[bytes]:
    """Each block's ``extras_key`` for a request, as vLLM builds them: the LoRA name on every
    block, then the cache salt on the first one only (no multimodal inputs)."""
    lora: list[object] = [lora_name] if lora_name else []
    first = extras_key(lora + ([cache_salt] if cache_salt else []))
    rest = extras_key(lora)
    return [first] + [rest] * (blocks - 1) if blocks > 0 else []


def token_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    extra: bytes = b"",
    extras: Sequence[bytes] | None = None,
    parent: int = ROOT,
    first_block: int = 0,
    max_blocks: int | None = None,
) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` from ``first_block`` on, the chain
    continuing from ``parent`` (the hash of block ``first_block - 1``, or the root). Each
    block's data is its tokens and ``extra`` or, when given, its own ``extras[i]``
    (indexed from ``first_block``)."""
    end = len(token_ids) // block_size
    if max_blocks is not None:
        end = min(end, first_block + max_blocks)
    hashes: list[int] = []
    if end <= first_block:
        return hashes
    data = array("I", token_ids[first_block * block_size : end * block_size]).tobytes()
    width = len(data) // (end - first_block)
    keys = list(extras[: end - first_block]) if extras is not None else []
    if not any(keys) and not (extra and len(keys) < end - first_block):
        for start in range(0, len(data), width):  # no block has extra keys
            parent = _digest(data[start : start + width], parent)
            hashes.append(parent)
        return hashes
    for j, start in enumerate(range(0, len(data), width)):
        key = keys[j] if j < len(keys) else extra
        parent = _digest(data[start : start + width] + key, parent)
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
