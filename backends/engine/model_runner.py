"""The contract between the engine and whatever computes a step (simulation or torch)."""

from __future__ import annotations

from typing import Protocol

from backends.engine.kv_blocks import KVBlockIO
from backends.engine.step import StepInput, StepOutput


class ModelRunner(KVBlockIO, Protocol):
    """Computes model steps; owns the KV cache's memory (whose blocks it reads and writes for
    prefill/decode transfers: ``KVBlockIO``) and the resident LoRA adapters.

    ``execute`` first applies the step's ``transfers`` in order (a block's KV copied to or
    from the host tier; a runner that keeps no KV only charges their time), then writes the
    KV of each sequence's ``input_ids`` into its ``slot_mapping`` slots, attends over its
    ``block_table``, and returns, aligned with ``step.seqs``, the sampled next
    token for sequences whose ``do_sample`` is true and None for the others (a prefill chunk
    that is not the last), with the token's log-probability where ``sampling.logprobs`` asks.
    A runner never reads the engine's ``Sequence`` objects.
    """

    def num_kv_blocks(self, block_size: int) -> int | None:
        """How many KV blocks of ``block_size`` tokens its memory budget holds; None when it
        keeps no KV itself (the engine's configured count is used). Called once, before the
        block manager is built, so that the cache and the block manager agree."""
        ...

    async def execute(self, step: StepInput) -> StepOutput:
        """Run one step; may take real (torch) or simulated (sleep) time."""
        ...

    def is_alive(self) -> bool:
        """False once the runner can compute no more steps (its engine process died): the
        server's ``/health`` then fails, so that an orchestrator restarts it."""
        ...

    def release(self, seq_id: int) -> None:
        """Forget any per-sequence state; called once when the sequence finishes or aborts."""
        ...

    async def load_lora(self, name: str, path: str) -> None:
        """Make adapter ``name`` available (raises ValueError if ``path`` is unusable)."""
        ...

    def unload_lora(self, name: str) -> None:
        """Forget adapter ``name``; it is no longer resident."""
        ...
