"""Precise prefix index: which endpoint holds which KV blocks, from the engines' own KV events.

Blocks are keyed by kvgate's chained hash of their token ids (and LoRA name), so the engine's
hash function and seed need not match: ``key_i = xxh64(tokens_i ‖ lora, seed=key_{i-1})``
(``kvgate.wire.block_hash``).
Each endpoint's engine hashes are mapped to these keys as ``BlockStored`` events arrive.
``BlockRemoved`` and ``AllBlocksCleared`` remove entries; a gap in an endpoint's event sequence
numbers, or a sequence that starts again (a restarted engine), clears that endpoint, since its
cache can no longer be known. The picker's own decisions are recorded speculatively for a
short TTL, to cover the time before the engine's events arrive.

Blocks an engine keeps in a lower tier (events whose ``medium`` is ``CPU`` or ``STORAGE``:
offloaded KV, restored on a hit instead of computed) are kept per tier, and a match credits
each such block at its tier's weight (what a restore saves of computing it: ``tier_weights``)
where the device does not hold it; a tier without a weight is ignored.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kvgate.wire.block_hash import (
    ROOT,
    extras_key,
    hash_block,
    request_extras,
    token_block_hashes,
)
from kvgate.wire.kv_events import GPU, AllBlocksCleared, BlockRemoved, BlockStored, decode_event


def block_keys(
    token_ids: Sequence[int],
    block_size: int,
    lora: str | None = None,
    parent: int = ROOT,
    max_blocks: int | None = None,
    cache_salt: str | None = None,
) -> list[int]:
    """A request's chained keys of the full blocks of ``token_ids``, each block's extra keys
    (LoRA name, the cache salt on the first block) in its identity, as vLLM hashes them."""
    blocks = len(token_ids) // block_size
    if max_blocks is not None:
        blocks = min(blocks, max_blocks)
    extras = request_extras(lora, cache_salt, blocks)
    return token_block_hashes(
        token_ids, block_size, extras=extras, parent=parent, max_blocks=max_blocks
    )


def group_root(group: int) -> int:
    """Where a KV-cache group's chains start: group 0 (full attention, what requests match)
    at the root, every other group elsewhere, so equal engine hashes of two groups differ."""
    return ROOT if group == 0 else hash_block(ROOT, b"\x00group:%d" % group)


def stored_keys(event: BlockStored, parent: int) -> list[int]:
    """The keys of a ``BlockStored`` event's blocks, chained on from ``parent``."""
    blocks = len(event.block_hashes)
    if event.extra_keys is not None:
        extras = [extras_key(k) for k in event.extra_keys]
    else:  # an older publisher: the LoRA name is the only extra key it tells
        extras = [extras_key([event.lora_name] if event.lora_name else None)] * blocks
    return token_block_hashes(event.token_ids, event.block_size, extras=extras, parent=parent)


@dataclass(frozen=True)
class KVEventHooks:
    """What the KV-event path tells the picker's metrics (each hook optional): ``lag`` a
    batch's delay in seconds; ``unusable(endpoint, reason)`` a message or event that taught the
    index nothing (``malformed``, ``undecodable``; ``unkeyed``: blocks stored on a parent the
    index never saw, so their chain cannot be keyed); ``reset(endpoint, reason)`` everything
    known of an endpoint forgotten at once (``gap``: batches lost; ``restart``: its sequence
    numbers started again; ``cleared``: the engine said it cleared its cache). Routing on an
    index that keeps losing what it knew falls back to load: these say why."""

    lag: Callable[[float], None] | None = None
    unusable: Callable[[str, str], None] | None = None
    reset: Callable[[str, str], None] | None = None


EngineBlock = tuple[int, int]  # (KV-cache group, the engine's block hash)


@dataclass
class _Matched:
    """One request's matches so far, taken while the index had seen ``changes`` changes."""

    keys: list[int]
    changes: int
    until: float = math.inf  # when a speculative block counted in ``depths`` expires
    depths: dict[str, float] = field(default_factory=dict)


@dataclass
class _Tier:
    """The blocks one endpoint holds in one tier."""

    keys_by_engine_hash: dict[EngineBlock, int] = field(default_factory=dict)
    key_counts: dict[int, int] = field(default_factory=dict)  # an engine may store a block twice

    def key_of(self, block: EngineBlock) -> int | None:
        return self.keys_by_engine_hash.get(block)

    def add(self, block: EngineBlock, key: int) -> bool:
        """Count ``block`` under ``key``; False when it was counted already."""
        if self.keys_by_engine_hash.get(block) == key:
            return False  # stored again (vLLM reports reused blocks too)
        self.keys_by_engine_hash[block] = key
        self.key_counts[key] = self.key_counts.get(key, 0) + 1
        return True

    def remove(self, block: EngineBlock) -> int | None:
        """Uncount ``block``; its key when the tier now holds none of that key."""
        key = self.keys_by_engine_hash.pop(block, None)
        if key is None:
            return None
        remaining = self.key_counts.get(key, 1) - 1
        if remaining > 0:
            self.key_counts[key] = remaining
            return None
        self.key_counts.pop(key, None)
        return key


@dataclass
class _EndpointState(_Tier):
    """An endpoint's device blocks (its own fields) and lower tiers' (``lower``)."""

    lower: dict[str, _Tier] = field(default_factory=dict)  # by medium: CPU, STORAGE
    last_seq: dict[int | None, int] = field(default_factory=dict)  # per data-parallel rank
    speculative: dict[int, float] = field(default_factory=dict)  # key -> expiry (monotonic)

    def parent_key(self, block: EngineBlock) -> int | None:
        """The key of a stored block's parent, in whichever tier holds it."""
        for tier in (self, *self.lower.values()):
            key = tier.key_of(block)
            if key is not None:
                return key
        return None


class PreciseIndex:
    """Which endpoint holds which block, from KV-event batches, plus speculative picks."""

    def __init__(
        self,
        speculative_ttl: float = 2.0,
        hooks: KVEventHooks | None = None,
        tier_weights: Mapping[str, float] | None = None,
    ) -> None:
        self.speculative_ttl = speculative_ttl
        self.hooks = hooks or KVEventHooks()
        self.tier_weights = {m: w for m, w in (tier_weights or {}).items() if w > 0}
        self._owners: dict[int, set[str]] = {}
        self._endpoints: dict[str, _EndpointState] = {}
        self.gaps = 0
        self.restarts = 0
        self._changes = 0  # batches applied, clears, speculative records and take-backs
        self._matched: _Matched | None = None
        # the chains' first keys speculated on, by endpoint, and until when (``holders_of``)
        self._heads: dict[int, dict[str, float]] = {}

    def __len__(self) -> int:
        return len(self._owners)

    def blocks_of(self, address: str) -> int:
        state = self._endpoints.get(address)
        return len(state.key_counts) if state else 0

    def last_seq(self, address: str, rank: int | None = None) -> int:
        """The sequence number of the last batch applied from ``address`` (-1: none yet)."""
        state = self._endpoints.get(address)
        return -1 if state is None else state.last_seq.get(rank, -1)

    # -- events -----------------------------------------------------------------------------
    def apply_batch(
        self, address: str, seq: int, events: Iterable[object], rank: int | None = None
    ) -> None:
        """Apply one event batch from ``address`` (raw events, as ``kv_events.decode_event``
        reads them; unknown ones, and blocks of tiers without a weight, are skipped).
        Sequence numbers are counted per data-parallel ``rank``."""
        self._changes += 1
        state = self._endpoints.setdefault(address, _EndpointState())
        last = state.last_seq.get(rank, -1)
        if last >= 0 and seq != last + 1:
            if seq <= last:
                self.restarts += 1
            else:
                self.gaps += 1
            if self.hooks.reset is not None:
                self.hooks.reset(address, "restart" if seq <= last else "gap")
            self.clear(address)
            state = self._endpoints.setdefault(address, _EndpointState())
        state.last_seq[rank] = seq
        for raw in events:
            event = decode_event(raw)
            if isinstance(event, BlockStored):
                if event.medium in (None, GPU):
                    self._stored(address, state, event)
                elif event.medium in self.tier_weights:
                    tier = state.lower.setdefault(event.medium, _Tier())
                    self._stored(address, state, event, tier)
            elif isinstance(event, BlockRemoved):
                if event.medium in (None, GPU):
                    self._removed(address, state, event.group_idx, event.block_hashes)
                elif event.medium in state.lower:
                    lower = state.lower[event.medium]
                    for engine_hash in event.block_hashes:
                        lower.remove((event.group_idx, engine_hash))
            elif isinstance(event, AllBlocksCleared):
                if self.hooks.reset is not None:
                    self.hooks.reset(address, "cleared")
                self.clear(address, keep_seq=True)

    def _stored(
        self, address: str, state: _EndpointState, event: BlockStored, lower: _Tier | None = None
    ) -> None:
        """Key and count ``event``'s blocks in the device tier, or in ``lower``."""
        group = event.group_idx
        if event.parent_block_hash is None:
            parent_key = group_root(group)
        else:
            known = state.parent_key((group, event.parent_block_hash))
            if known is None:  # its parent was never seen: the chain cannot be keyed
                if self.hooks.unusable is not None:
                    self.hooks.unusable(address, "unkeyed")
                return
            parent_key = known
        keys = stored_keys(event, parent_key)
        for engine_hash, key in zip(event.block_hashes, keys, strict=False):
            if lower is not None:
                lower.add((group, engine_hash), key)
            elif state.add((group, engine_hash), key):
                self._owners.setdefault(key, set()).add(address)

    def _removed(
        self, address: str, state: _EndpointState, group: int, hashes: Iterable[int]
    ) -> None:
        for engine_hash in hashes:
            key = state.remove((group, engine_hash))
            if key is not None:
                self._drop(key, address)

    def clear(self, address: str, keep_seq: bool = False) -> None:
        self._changes += 1
        state = self._endpoints.pop(address, None)
        if state is None:
            return
        for key in state.key_counts:
            self._drop(key, address)
        if keep_seq:
            self._endpoints[address] = _EndpointState(last_seq=dict(state.last_seq))

    def _drop(self, key: int, address: str) -> None:
        owners = self._owners.get(key)
        if owners is not None:
            owners.discard(address)
            if not owners:
                del self._owners[key]

    # -- lookups ----------------------------------------------------------------------------
    def record_speculative(self, address: str, keys: list[int]) -> list[int]:
        """Count ``keys`` as held by ``address`` for ``speculative_ttl`` seconds (until its
        events arrive); the keys that were not already speculated."""
        self._changes += 1
        now = time.monotonic()
        state = self._endpoints.setdefault(address, _EndpointState())
        if len(state.speculative) > 100_000:
            state.speculative = {k: t for k, t in state.speculative.items() if t > now}
        added = [key for key in keys if key not in state.speculative]
        for key in keys:
            state.speculative[key] = now + self.speculative_ttl
        if keys:
            if len(self._heads) > 100_000:
                self._heads = {
                    k: live
                    for k, by in self._heads.items()
                    if (live := {a: t for a, t in by.items() if t > now})
                }
            self._heads.setdefault(keys[0], {})[address] = now + self.speculative_ttl
        return added

    def forget_speculative(self, address: str, keys: Iterable[int]) -> None:
        """Take back speculative ``keys`` of ``address`` (the endpoint never got the request)."""
        self._changes += 1
        state = self._endpoints.get(address)
        if state is not None:
            for key in keys:
                state.speculative.pop(key, None)
                if (heads := self._heads.get(key)) is not None:
                    heads.pop(address, None)

    def holders_of(self, key: int) -> list[str]:
        """The endpoints that hold ``key`` on their device, or were just sent a chain that
        starts with it (``key`` a chain's first block: what a pick's sample keeps)."""
        now = time.monotonic()
        held = set(self._owners.get(key, ()))
        held.update(a for a, expiry in self._heads.get(key, {}).items() if expiry > now)
        return list(held)

    def match(self, keys: list[int], addresses: Iterable[str]) -> dict[str, float]:
        """Per address, how many leading blocks it holds (or was just sent), a block held only
        in a lower tier counted at its tier's weight. The scorers of one pick ask about the
        same keys in turn: each address is walked once while the index is unchanged and no
        speculative block it counted has expired."""
        now = time.monotonic()
        memo = self._matched
        if (
            memo is None
            or memo.keys is not keys
            or memo.changes != self._changes
            or now >= memo.until
        ):
            memo = self._matched = _Matched(keys, self._changes)
        result: dict[str, float] = {}
        for address in addresses:
            known = memo.depths.get(address)
            if known is None:
                known, until = self._depth(keys, address, now)
                memo.depths[address] = known
                memo.until = min(memo.until, until)
            result[address] = known
        return result

    def _depth(self, keys: list[int], address: str, now: float) -> tuple[float, float]:
        """How many leading ``keys`` ``address`` holds (lower tiers' at their weights), and
        until when that stays true (the first expiry among the speculative blocks counted)."""
        state = self._endpoints.get(address)
        speculative = state.speculative if state is not None else {}
        owners_of = self._owners.get
        until = math.inf
        depth = 0
        for key in keys:
            owners = owners_of(key)
            if owners is None or address not in owners:
                expiry = speculative.get(key)
                if expiry is None or expiry <= now:
                    break
                until = min(until, expiry)
            depth += 1
        if state is None or not state.lower or depth == len(keys):
            return depth, until
        return depth + self._lower_credit(state, keys[depth:]), until

    def _lower_credit(self, state: _EndpointState, keys: list[int]) -> float:
        """What the lower tiers hold of ``keys`` (the blocks after the device's), leading
        blocks only, each at the best weight among the tiers that hold it."""
        weights = self.tier_weights
        tiers = [(weights[m], t.key_counts) for m, t in state.lower.items()]  # all weighted
        credit = 0.0
        for key in keys:
            best = max((w for w, held in tiers if key in held), default=0.0)
            if not best:
                break
            credit += best
        return credit
