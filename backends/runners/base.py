"""The contract between the engine loop and whatever computes a step (simulation or torch)."""

from __future__ import annotations

from typing import Protocol

from backends.engine.scheduler import ScheduledSeq
from backends.engine.sequence import Sequence


class ModelRunner(Protocol):
    """Computes one scheduler step.

    ``execute`` computes the KV of each item's ``num_new_tokens`` (reading the sequence's block
    table) and returns, aligned with ``batch``, the sampled next token for items whose
    ``samples`` is true and None for the others (a prefill chunk that is not the last).
    """

    async def execute(self, batch: list[ScheduledSeq]) -> list[int | None]:
        """Run one step; may take real (torch) or simulated (sleep) time."""
        ...

    def release(self, seq: Sequence) -> None:
        """Forget any per-sequence state; called once when ``seq`` finishes or is aborted."""
        ...

    async def load_lora(self, name: str, path: str) -> None:
        """Make adapter ``name`` available (raises ValueError if ``path`` is unusable)."""
        ...

    def unload_lora(self, name: str) -> None:
        """Forget adapter ``name``; it is no longer resident."""
        ...
