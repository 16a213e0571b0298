"""The seam through which KV blocks enter and leave the engine (prefill/decode workers).

Modelled on vLLM's ``KVConnectorBase_V1``, split the same way into a scheduler side (which
tokens of a new request can be loaded from elsewhere, and when they have arrived) and a worker
side (a hook after every step, where a prefill worker offers the blocks it just wrote). A
sequence whose KV is being loaded waits in ``SequenceStatus.WAITING_FOR_REMOTE_KV`` with its
blocks allocated; once the load is done it runs from the first token that was not loaded.
``NoKVConnector`` loads nothing and keeps the engine's behaviour without one.
"""

from __future__ import annotations

from typing import Protocol

from backends.engine.sequence import Sequence
from backends.engine.step import StepInput


class KVConnector(Protocol):
    """Moves KV blocks in and out of the engine: scheduler side and worker side."""

    # -- scheduler side ---------------------------------------------------------------------
    def on_new_request(self, seq: Sequence) -> None:
        """``seq`` joined the waiting queue (e.g. to keep a remote lease on its KV alive)."""
        ...

    def num_external_tokens(self, seq: Sequence, num_local_tokens: int) -> int:
        """How many tokens after the ``num_local_tokens`` found in the local prefix cache can
        be loaded from elsewhere (0: compute them here). A positive answer makes the scheduler
        allocate blocks for them and call ``start_load``."""
        ...

    def start_load(self, seq: Sequence, block_ids: list[int], num_external: int) -> None:
        """Begin loading ``num_external`` tokens' KV into ``block_ids`` (the sequence's whole
        block table); the sequence waits until ``finished_loads`` names it."""
        ...

    def finished_loads(self) -> list[int]:
        """Sequence ids whose loads completed since the last call (successfully or not: a
        failed load is reported by ``failed``)."""
        ...

    def failed(self, seq_id: int) -> bool:
        """True if the load of ``seq_id`` failed (its tokens are then computed locally)."""
        ...

    def request_finished(self, seq: Sequence) -> bool:
        """``seq`` finished or was aborted. True keeps its blocks allocated for the connector
        (a prefill worker holding them for a decode worker), which frees them later through
        the block manager; False has the engine free them now. Ignored for an aborted
        sequence, whose blocks are always freed at once."""
        ...

    # -- worker side ------------------------------------------------------------------------
    def after_step(self, step: StepInput) -> None:
        """Called after each step the runner computed (e.g. to offer the KV just written)."""
        ...


class NoKVConnector:
    """Loads nothing, offers nothing: every token's KV is computed by this engine."""

    def on_new_request(self, seq: Sequence) -> None:
        return None

    def num_external_tokens(self, seq: Sequence, num_local_tokens: int) -> int:
        return 0

    def start_load(self, seq: Sequence, block_ids: list[int], num_external: int) -> None:
        raise RuntimeError("NoKVConnector loads no KV")

    def finished_loads(self) -> list[int]:
        return []

    def failed(self, seq_id: int) -> bool:
        return False

    def request_finished(self, seq: Sequence) -> bool:
        return False

    def after_step(self, step: StepInput) -> None:
        return None
