"""A request as the engine sees it: token ids, progress, block table and sampling params.

Progress follows vLLM v1: ``num_computed_tokens`` chases ``num_tokens``. A step computes the KV
of ``num_tokens - num_computed_tokens`` tokens (or a chunk of them); once every known token is
computed, the runner samples one new token, which is appended and becomes the next to compute.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum

from backends.engine.kv_transfer_params import KVTransferParams


class SequenceStatus(Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"  # blocks allocated, KV loading (KVConnector)
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(Enum):
    LENGTH = "length"
    STOP = "stop"
    ABORT = "abort"


MAX_LOGPROBS = 20  # alternatives per position, as vLLM's max_logprobs default
TopLogprobs = tuple[tuple[int, float], ...]  # (token id, log-probability), most likely first
# a prompt token's log-probability given the tokens before it, its rank in that distribution
# (1: the most likely) and the most likely tokens there
PromptLogprob = tuple[float, int, TopLogprobs]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What to generate: at most ``max_tokens`` tokens; stop early on EOS or a stop token, but
    not before ``min_tokens``. ``temperature`` 0 is greedy; ``top_k`` 0 or -1 keeps every
    token. ``logprobs`` asks for the chosen token's log-probability, ``top_logprobs`` (with it)
    for that many of the most likely tokens at each position too (vLLM's limit: 20);
    ``prompt_logprobs`` (0-20) for the prompt's tokens (the prompt is then computed whole: no
    prefix-cache hits, as each position's logits are needed)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0  # rule out tokens less likely than min_p times the likeliest one
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or at least 0, got {self.top_k}")
        if not 0 <= self.top_logprobs <= MAX_LOGPROBS:
            raise ValueError(
                f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {self.top_logprobs}"
            )
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_LOGPROBS:
            raise ValueError(
                f"prompt_logprobs must be in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs}"
            )
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            raise ValueError(f"seed must fit in 64 bits (as vLLM's), got {self.seed}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


_ids = itertools.count()


@dataclass(eq=False, slots=True)
class Sequence:
    """One request's state inside the engine. Lower ``priority`` values are served first."""

    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    lora_name: str | None = None
    cache_salt: str | None = None  # only requests with the same salt share cached blocks
    priority: int = 0
    request_id: str = ""
    kv_transfer: KVTransferParams | None = None  # prefill/decode: where its KV goes or is
    # another sample of the same prompt (``n`` > 1): this one is admitted once that one's prompt
    # is computed, and takes its prompt blocks from the prefix cache, shared, not computed again
    parent: Sequence | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    scheduled_time: float = 0.0  # monotonic, when first scheduled (0: still waiting)
    seq_id: int = field(default_factory=lambda: next(_ids))
    status: SequenceStatus = SequenceStatus.WAITING
    token_ids: list[int] = field(init=False)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    output_logprobs: list[float] = field(default_factory=list)  # when sampling.logprobs
    # the most likely tokens and their log-probabilities at each position, when asked for
    output_top_logprobs: list[TopLogprobs] = field(default_factory=list)
    # the second prompt token's onwards, when sampling.prompt_logprobs asks
    prompt_logprobs: list[PromptLogprob] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("a sequence needs at least one prompt token")
        self.token_ids = list(self.prompt_token_ids)
        if not self.request_id:
            self.request_id = f"seq-{self.seq_id}"

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def waits_for_parent(self) -> bool:
        """Whether this sample's parent is still computing the prompt they share."""
        parent = self.parent
        return (
            parent is not None
            and not parent.is_finished
            and parent.num_computed_tokens < len(parent.prompt_token_ids)
        )

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def is_prefill(self) -> bool:
        """True while the prompt (or a recomputed prefix after preemption) is not computed."""
        return self.num_computed_tokens < self.num_tokens - 1

    def sort_key(self) -> tuple[int, float, int]:
        """Admission order: priority, then arrival, then id (stable for equal arrivals)."""
        return (self.priority, self.arrival_time, self.seq_id)

    def block_tokens(self, index: int, block_size: int) -> list[int]:
        return self.token_ids[index * block_size : (index + 1) * block_size]
