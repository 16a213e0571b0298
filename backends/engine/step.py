"""The typed input of one model step: what a ``ModelRunner`` computes, without ``Sequence``.

The engine builds it from the scheduler's output. For each scheduled sequence: the token ids
whose KV is computed this step and their positions, the KV slot each of them is written to
(``slot_mapping``), the block table to read the context through, how many tokens the attention
covers after this step, the adapter, the sampling parameters and whether a token is sampled.
A slot is ``block_table[position // block_size] * block_size + position % block_size``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.engine.host_tier import KVTransfer
from backends.engine.sequence import PromptLogprob, SamplingParams, Sequence, TopLogprobs


@dataclass(slots=True)
class ScheduledSeq:
    """``num_new_tokens`` of ``seq`` get their KV computed this step."""

    seq: Sequence
    num_new_tokens: int
    # speculative decoding: tokens guessed to follow, computed after the sequence's own in the
    # same pass and kept as far as the runner's sampling agrees with them
    draft_token_ids: list[int] = field(default_factory=list)

    @property
    def samples(self) -> bool:
        """True when this step reaches the last known token, so a new token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass(frozen=True, slots=True)
class SeqStep:
    """One sequence's part of a step."""

    seq_id: int
    input_ids: list[int]  # tokens whose KV this step computes, in order
    start_position: int  # position of input_ids[0] (= tokens already computed or cached)
    slot_mapping: list[int]  # KV-cache slot of each input token
    block_table: list[int]  # physical blocks of the whole context, in order
    lora_name: str | None
    sampling: SamplingParams
    do_sample: bool  # a token is sampled from the last input's logits
    is_decode: bool  # one token after a fully computed context (no drafts)
    prompt_token_ids: list[int]  # the request's prompt (sampling seeds and penalties read it)
    num_draft_tokens: int = 0  # the last input_ids are drafts: each row's token is sampled

    @property
    def num_new_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_context_tokens(self) -> int:
        """Tokens attended over once this step's KV is written (context + new)."""
        return self.start_position + len(self.input_ids)

    @property
    def positions(self) -> range:
        return range(self.start_position, self.num_context_tokens)


@dataclass(frozen=True, slots=True)
class StepInput:
    """Everything one step computes, aligned with the runner's returned samples; and the
    blocks moved between the device and the host tier since the last step, which the runner
    applies, in order, before it computes."""

    seqs: list[SeqStep]
    block_size: int
    transfers: list[KVTransfer] = field(default_factory=list)

    @property
    def num_restored_blocks(self) -> int:
        return sum(1 for t in self.transfers if t.restore)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.seqs if not s.is_decode)

    @property
    def num_decode_seqs(self) -> int:
        return sum(1 for s in self.seqs if s.is_decode)

    @property
    def lora_names(self) -> set[str]:
        return {s.lora_name for s in self.seqs if s.lora_name is not None}


@dataclass(frozen=True, slots=True)
class StepOutput:
    """A runner's result, aligned with ``StepInput.seqs``: the sampled token of each sequence
    that samples (None for the others) and, where asked for, its log-probability and the most
    likely tokens', and the prompt tokens' log-probabilities this step's positions give (for
    sequences that ask ``prompt_logprobs``). A sequence given drafts gets, in ``accepted``,
    the leading drafts its sampling kept; its token is the one sampled after the last of
    them."""

    tokens: list[int | None]
    logprobs: list[float | None] | None = None
    top_logprobs: list[TopLogprobs | None] | None = None
    prompt_logprobs: list[list[PromptLogprob] | None] | None = None
    accepted: list[list[int] | None] | None = None


def build_step(
    scheduled: list[ScheduledSeq], block_size: int, transfers: list[KVTransfer] | None = None
) -> StepInput:
    """The step input for the scheduler's output; raises ``ValueError`` if a sequence's block
    table does not cover the tokens it computes (a scheduler bug, never silently misplaced)."""
    seqs: list[SeqStep] = []
    for item in scheduled:
        seq, drafts = item.seq, item.draft_token_ids
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + item.num_new_tokens
        last = end + len(drafts)
        table = seq.block_table
        if -(-last // block_size) > len(table):
            raise ValueError(
                f"sequence {seq.seq_id}: {len(table)} blocks cannot hold {last} tokens"
            )
        slots = [table[p // block_size] * block_size + p % block_size for p in range(start, last)]
        seqs.append(
            SeqStep(
                seq_id=seq.seq_id,
                input_ids=seq.token_ids[start:end] + drafts,
                start_position=start,
                slot_mapping=slots,
                block_table=list(table),
                lora_name=seq.lora_name,
                sampling=seq.sampling,
                do_sample=end == seq.num_tokens,
                is_decode=item.num_new_tokens == 1 and not seq.is_prefill and not drafts,
                prompt_token_ids=seq.prompt_token_ids,
                num_draft_tokens=len(drafts),
            )
        )
    return StepInput(seqs, block_size, transfers or [])
