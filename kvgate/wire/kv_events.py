"""KV-cache events in vLLM's vocabulary and its wire format, for both ends of the stream.

The backend's block manager records ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``;
its publisher sends them with ``encode_batch``; the EPP's subscriber reads them back with
``decode_batch`` / ``decode_event``. A batch is msgpack ``[ts, [event, ...], data_parallel_rank]``
with ``ts`` in wall-clock seconds (``time.time()``, as vLLM), and each event a positional array
tagged with its class name: ``["BlockStored", block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium, lora_name]``, ``["BlockRemoved", block_hashes, medium]``,
``["AllBlocksCleared"]``. Hashes are 64-bit integers, as with vLLM's default
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

MEDIUM = "GPU"


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Consecutive blocks became full and cached; ``token_ids`` covers all of them in order."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_name: str | None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Cached blocks were evicted and their contents are gone."""

    block_hashes: list[int]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was dropped."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventFormatError(ValueError):
    """A batch that is not msgpack ``[ts, events, ...]``."""


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One decoded batch: its timestamp (``None`` when not a number) and its raw events."""

    ts: float | None
    events: list[object]


def encode_event(event: KVEvent) -> list[Any]:
    if isinstance(event, BlockStored):
        return [
            "BlockStored",
            event.block_hashes,
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            None,  # lora_id: deprecated in vLLM in favour of lora_name
            MEDIUM,
            event.lora_name,
        ]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", event.block_hashes, MEDIUM]
    if isinstance(event, AllBlocksCleared):
        return ["AllBlocksCleared"]
    raise TypeError(f"not a KV event: {event!r}")


def encode_batch(events: list[KVEvent], ts: float) -> bytes:
    payload: bytes = msgpack.packb([ts, [encode_event(e) for e in events], None])
    return payload


def decode_batch(payload: bytes) -> EventBatch:
    """The batch's timestamp and events (still raw: decode each with ``decode_event``)."""
    try:
        batch = msgpack.unpackb(payload)
        ts, events = batch[0], batch[1]
    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as exc:
        raise KVEventFormatError(str(exc)) from exc
    return EventBatch(
        float(ts) if isinstance(ts, int | float) else None,
        events if isinstance(events, list) else [],
    )


def decode_event(raw: object) -> KVEvent | None:
    """The typed event for one raw event; ``None`` for kinds or shapes it does not know."""
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes) or not raw:
        return None
    kind = raw[0]
    if kind == "BlockStored" and len(raw) >= 5:
        hashes, parent, token_ids, block_size = raw[1], raw[2], raw[3], raw[4]
        lora = raw[7] if len(raw) > 7 else None
        if (
            not isinstance(hashes, list)
            or not isinstance(token_ids, list)
            or not isinstance(block_size, int)
            or not (parent is None or isinstance(parent, int))
        ):
            return None
        return BlockStored(
            hashes, parent, token_ids, block_size, lora if isinstance(lora, str) else None
        )
    if kind == "BlockRemoved" and len(raw) >= 2 and isinstance(raw[1], list):
        return BlockRemoved(raw[1])
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None
