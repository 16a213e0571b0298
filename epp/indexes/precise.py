"""Precise prefix index: which endpoint holds which KV blocks, from the engines' own KV events.

Blocks are keyed by kvgate's chained hash of their token ids (and LoRA name), so the engine's
hash function and seed need not match: ``key_i = xxh64(tokens_i ‖ lora, seed=key_{i-1})``
(``kvgate.wire.block_hash``).
Each endpoint's engine hashes are mapped to these keys as ``BlockStored`` events arrive.
``BlockRemoved`` and ``AllBlocksCleared`` remove entries; a gap in an endpoint's event sequence
numbers, or a sequence that starts again (a restarted engine), clears that endpoint, since its
cache can no longer be known. The picker's own decisions are recorded speculatively for a
short TTL, to cover the time before the engine's events arrive.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvgate.wire.block_hash import ROOT, extra_key, token_block_hashes
from kvgate.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, decode_event


def block_keys(
    token_ids: Sequence[int],
    block_size: int,
    lora: str | None = None,
    parent: int = ROOT,
    max_blocks: int | None = None,
) -> list[int]:
    """Chained keys of the full blocks of ``token_ids`` (``kvgate.wire.block_hash``)."""
    return token_block_hashes(
        token_ids, block_size, extra=extra_key(lora), parent=parent, max_blocks=max_blocks
    )


@dataclass
class _EndpointState:
    keys_by_engine_hash: dict[int, int] = field(default_factory=dict)
    key_counts: dict[int, int] = field(default_factory=dict)  # an engine may store a block twice
    last_seq: int = -1
    speculative: dict[int, float] = field(default_factory=dict)  # key -> expiry (monotonic)


class PreciseIndex:
    """Which endpoint holds which block, from KV-event batches, plus speculative picks."""

    def __init__(self, speculative_ttl: float = 2.0) -> None:
        self.speculative_ttl = speculative_ttl
        self._owners: dict[int, set[str]] = {}
        self._endpoints: dict[str, _EndpointState] = {}
        self.gaps = 0
        self.restarts = 0

    def __len__(self) -> int:
        return len(self._owners)

    def blocks_of(self, address: str) -> int:
        state = self._endpoints.get(address)
        return len(state.key_counts) if state else 0

    # -- events -----------------------------------------------------------------------------
    def apply_batch(self, address: str, seq: int, events: Iterable[object]) -> None:
        """Apply one event batch from ``address`` (raw events, as ``kv_events.decode_event``
        reads them; unknown ones are skipped)."""
        state = self._endpoints.setdefault(address, _EndpointState())
        if state.last_seq >= 0 and seq != state.last_seq + 1:
            if seq <= state.last_seq:
                self.restarts += 1
            else:
                self.gaps += 1
            self.clear(address)
            state = self._endpoints.setdefault(address, _EndpointState())
        state.last_seq = seq
        for raw in events:
            event = decode_event(raw)
            if isinstance(event, BlockStored):
                self._stored(address, state, event)
            elif isinstance(event, BlockRemoved):
                self._removed(address, state, event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.clear(address, keep_seq=True)

    def _stored(self, address: str, state: _EndpointState, event: BlockStored) -> None:
        if event.parent_block_hash is None:
            parent_key = ROOT
        else:
            known = state.keys_by_engine_hash.get(event.parent_block_hash)
            if known is None:
                return  # its parent was never seen: the chain cannot be keyed
            parent_key = known
        keys = block_keys(event.token_ids, event.block_size, event.lora_name, parent_key)
        for engine_hash, key in zip(event.block_hashes, keys, strict=False):
            if state.keys_by_engine_hash.get(engine_hash) == key:
                continue
            state.keys_by_engine_hash[engine_hash] = key
            state.key_counts[key] = state.key_counts.get(key, 0) + 1
            self._owners.setdefault(key, set()).add(address)

    def _removed(self, address: str, state: _EndpointState, hashes: Iterable[int]) -> None:
        for engine_hash in hashes:
            key = state.keys_by_engine_hash.pop(engine_hash, None)
            if key is None:
                continue
            remaining = state.key_counts.get(key, 1) - 1
            if remaining > 0:
                state.key_counts[key] = remaining
            else:
                state.key_counts.pop(key, None)
                self._drop(key, address)

    def clear(self, address: str, keep_seq: bool = False) -> None:
        state = self._endpoints.pop(address, None)
        if state is None:
            return
        for key in state.key_counts:
            self._drop(key, address)
        if keep_seq:
            self._endpoints[address] = _EndpointState(last_seq=state.last_seq)

    def _drop(self, key: int, address: str) -> None:
        owners = self._owners.get(key)
        if owners is not None:
            owners.discard(address)
            if not owners:
                del self._owners[key]

    # -- lookups ----------------------------------------------------------------------------
    def record_speculative(self, address: str, keys: Iterable[int]) -> None:
        now = time.monotonic()
        state = self._endpoints.setdefault(address, _EndpointState())
        if len(state.speculative) > 100_000:
            state.speculative = {k: t for k, t in state.speculative.items() if t > now}
        for key in keys:
            state.speculative[key] = now + self.speculative_ttl

    def match(self, keys: list[int], addresses: Iterable[str]) -> dict[str, int]:
        """Per address, how many leading blocks it holds (or was just sent)."""
        now = time.monotonic()
        result: dict[str, int] = {}
        for address in addresses:
            state = self._endpoints.get(address)
            depth = 0
            for key in keys:
                owners = self._owners.get(key)
                held = owners is not None and address in owners
                if not held and state is not None:
                    expiry = state.speculative.get(key)
                    held = expiry is not None and expiry > now
                if not held:
                    break
                depth += 1
            result[address] = depth
        return result
