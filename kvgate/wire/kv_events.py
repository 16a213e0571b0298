"""KV-cache events in vLLM's vocabulary and its wire format, for both ends of the stream.

The backend's block manager records ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``;
its publisher sends them with ``encode_batch``; the EPP's subscriber reads them back with
``decode_batch`` / ``decode_event``. A batch is msgpack ``[ts, [event, ...], data_parallel_rank]``
(the rank sent always; read without it too, as older vLLM sent it), ``ts`` in wall-clock
seconds (``time.time()``, as vLLM).

Each event is, as current vLLM (0.32) sends it, a msgspec *tagged map*:
``{"type": "BlockStored", "block_hashes": [...], "parent_block_hash": ..., "token_ids": [...],
"block_size": 128, "lora_id": ..., "medium": "GPU", "lora_name": ..., "extra_keys": [...],
"group_idx": 0, ...}`` (fields at their default are left out). Older vLLM sent positional
arrays tagged with the class name: ``["BlockStored", block_hashes, parent_block_hash,
token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx]``,
``["BlockRemoved", block_hashes, medium, group_idx]``, ``["AllBlocksCleared"]``; both decode.
Hashes are 64-bit integers (vLLM's default ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) or raw
bytes, which decode to the integer of their last 8 bytes, as vLLM's conversion does.
``medium`` names the cache tier (``GPU``; ``CPU`` or ``STORAGE`` for offloaded copies).
``extra_keys`` holds, per block, the extra keys of its hash: the LoRA name, multimodal
``(identifier, offset)`` pairs, the ``cache_salt`` (first block only), prompt-embedding digests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

GPU = "GPU"
_MASK = (1 << 64) - 1
BlockExtras = tuple[object, ...] | None  # one block's extra keys, as published


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Consecutive blocks became full and cached; ``token_ids`` covers all of them in order."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_name: str | None
    medium: str | None = GPU
    extra_keys: list[BlockExtras] | None = None  # per block; None: none published
    group_idx: int = 0  # the KV-cache group (hybrid models have several)


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Cached blocks were evicted and their contents are gone."""

    block_hashes: list[int]
    medium: str | None = GPU
    group_idx: int = 0


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was dropped."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventFormatError(ValueError):
    """A batch that is not msgpack ``[ts, events, ...]``."""


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One decoded batch: its timestamp (``None`` when not a number), its raw events and the
    publishing engine's data-parallel rank (``None`` when not sent)."""

    ts: float | None
    events: list[object]
    data_parallel_rank: int | None = None


def encode_event(event: KVEvent) -> dict[str, Any]:
    """The tagged map current vLLM sends (fields at their default left out, as msgspec's
    ``omit_defaults``)."""
    if isinstance(event, BlockStored):
        stored: dict[str, Any] = {
            "type": "BlockStored",
            "block_hashes": event.block_hashes,
            "parent_block_hash": event.parent_block_hash,
            "token_ids": event.token_ids,
            "block_size": event.block_size,
            "lora_id": None,  # deprecated in vLLM in favour of lora_name
            "medium": event.medium,
            "lora_name": event.lora_name,
            "group_idx": event.group_idx,
        }
        if event.extra_keys is not None:
            stored["extra_keys"] = [list(k) if k is not None else None for k in event.extra_keys]
        return stored
    if isinstance(event, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": event.block_hashes,
            "medium": event.medium,
            "group_idx": event.group_idx,
        }
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    raise TypeError(f"not a KV event: {event!r}")


def encode_batch(events: list[KVEvent], ts: float, data_parallel_rank: int = 0) -> bytes:
    """``[ts, events, data_parallel_rank]``: the rank always (0 without data parallelism), as
    vLLM's own engines send it; a decoder that reads a strict three-element array (Dynamo's)
    drops batches without it."""
    batch: list[Any] = [ts, [encode_event(e) for e in events], data_parallel_rank]
    payload: bytes = msgpack.packb(batch)
    return payload


def decode_batch(payload: bytes) -> EventBatch:
    """The batch's timestamp, events (still raw: decode each with ``decode_event``) and rank."""
    try:
        batch = msgpack.unpackb(payload)
        ts, events = batch[0], batch[1]
    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as exc:
        raise KVEventFormatError(str(exc)) from exc
    rank = batch[2] if len(batch) > 2 and isinstance(batch[2], int) else None
    return EventBatch(
        float(ts) if isinstance(ts, int | float) else None,
        events if isinstance(events, list) else [],
        rank,
    )


_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


def decode_event(raw: object) -> KVEvent | None:
    """The typed event for one raw event (tagged map or positional array); ``None`` for kinds
    or shapes it does not know."""
    if isinstance(raw, Mapping):
        kind, fields = raw.get("type"), raw
    elif isinstance(raw, Sequence) and not isinstance(raw, str | bytes) and raw:
        kind = raw[0]
        names = _STORED_FIELDS if kind == "BlockStored" else _REMOVED_FIELDS
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        return None
    if kind == "BlockStored":
        return _stored(fields)
    if kind == "BlockRemoved":
        hashes = _hashes(fields.get("block_hashes"))
        if hashes is None:
            return None
        return BlockRemoved(hashes, _medium(fields), _group(fields))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _stored(fields: Mapping[Any, Any]) -> BlockStored | None:
    hashes = _hashes(fields.get("block_hashes"))
    parent_raw = fields.get("parent_block_hash")
    parent = None if parent_raw is None else _hash(parent_raw)
    token_ids, block_size = fields.get("token_ids"), fields.get("block_size")
    if (
        hashes is None
        or (parent_raw is not None and parent is None)
        or not isinstance(token_ids, list)
        or not isinstance(block_size, int)
        or block_size <= 0
    ):
        return None
    lora = fields.get("lora_name")
    extras = fields.get("extra_keys")
    return BlockStored(
        hashes,
        parent,
        token_ids,
        block_size,
        lora if isinstance(lora, str) else None,
        _medium(fields),
        [tuple(k) if isinstance(k, list | tuple) else None for k in extras]
        if isinstance(extras, list)
        else None,
        _group(fields),
    )


def _hash(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value & _MASK
    if isinstance(value, bytes):
        return int.from_bytes(value, "big") & _MASK
    return None


def _hashes(value: object) -> list[int] | None:
    if not isinstance(value, list):
        return None
    hashes = [_hash(v) for v in value]
    return None if any(h is None for h in hashes) else [h for h in hashes if h is not None]


def _medium(fields: Mapping[Any, Any]) -> str | None:
    medium = fields.get("medium", GPU)
    return medium if isinstance(medium, str) else None


def _group(fields: Mapping[Any, Any]) -> int:
    group = fields.get("group_idx")
    return group if isinstance(group, int) and not isinstance(group, bool) else 0
