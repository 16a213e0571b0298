"""The prefill side's held requests: blocks kept for a decode worker under a lease.

A request prefilled for a remote decode keeps its blocks when it finishes. They are freed
when the decode worker has pulled them, when it releases them (its request was cancelled),
or when its heartbeats stop renewing the lease: nothing stays held for a worker that died.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from backends.engine.sequence import Sequence


@dataclass(slots=True)
class HeldRequest:
    remote_request_id: str
    seq: Sequence
    block_ids: tuple[int, ...]
    expires: float
    pulling: bool = False  # a pull is streaming its blocks (it is not expired under it)


class HeldBlocks:
    """Held requests by ``remote_request_id``; ``free`` gives a sequence's blocks back."""

    def __init__(
        self,
        free: Callable[[Sequence], None],
        lease_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lease_seconds <= 0:
            raise ValueError("the KV lease must be positive")
        self._free = free
        self.lease_seconds = lease_seconds
        self._clock = clock
        self._held: dict[str, HeldRequest] = {}
        self.num_expired = 0
        self.on_expired: Callable[[int], None] = lambda count: None

    @property
    def num_blocks(self) -> int:
        return sum(len(h.block_ids) for h in self._held.values())

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, remote_request_id: str, seq: Sequence) -> HeldRequest:
        """Keep ``seq``'s blocks (its block table as it finished) for a decode worker."""
        held = HeldRequest(
            remote_request_id, seq, tuple(seq.block_table), self._clock() + self.lease_seconds
        )
        self._held[remote_request_id] = held
        return held

    def get(self, remote_request_id: str) -> HeldRequest | None:
        return self._held.get(remote_request_id)

    def renew(self, remote_request_id: str) -> bool:
        """Extend a lease; False if the request is not held (pulled, released or expired)."""
        held = self._held.get(remote_request_id)
        if held is None:
            return False
        held.expires = self._clock() + self.lease_seconds
        return True

    def release(self, remote_request_id: str) -> bool:
        """Free a held request's blocks now; False if it was not held."""
        held = self._held.pop(remote_request_id, None)
        if held is None:
            return False
        self._free(held.seq)
        return True

    def expire(self) -> int:
        """Free every request whose lease lapsed (none under a pull); how many were."""
        now = self._clock()
        lapsed = [r for r, h in self._held.items() if h.expires <= now and not h.pulling]
        for remote_request_id in lapsed:
            self.release(remote_request_id)
        self.num_expired += len(lapsed)
        if lapsed:
            self.on_expired(len(lapsed))
        return len(lapsed)

    def release_all(self) -> None:
        for remote_request_id in list(self._held):
            self.release(remote_request_id)
