"""Simulated model runner: a cost model instead of a model.

A step "takes" ``a + b*prefill_tokens + c*decode_seqs + d*kv_tokens_read + e*lora_swaps +
f*restored_blocks`` seconds (slept, not burned), where prefill tokens are the uncached prompt
tokens computed this step (cached prefix tokens cost nothing), decode sequences are those
computing one token, KV tokens read are the context lengths attended over, a LoRA swap is an
adapter made resident in one of ``max_loras`` slots (LRU), and a restored block is one copied
back from the host tier (by default 40 µs, 5% of computing its 16 tokens: a block of a 1B
model's KV, 512 KiB, crosses a 25 GB/s link in about 20 µs, doubled for the transfer's set-up;
offloads overlap with compute and cost nothing). Sampled tokens are deterministic
pseudo-random draws from ``vocabulary``, keyed by the run seed, the request's seed (or its
prompt) and the position.
It keeps no KV: blocks moved to another worker carry only the size a real cache's would have
(``kv_bytes_per_token`` in bfloat16, by default a 1B Llama's: 16 layers x 8 heads x 64 x 2 x 2).
"""

from __future__ import annotations

import asyncio
from array import array
from collections import OrderedDict
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import xxhash

from backends.engine.kv_blocks import BlockData
from backends.engine.sequence import PromptLogprob, TopLogprobs
from backends.engine.step import SeqStep, StepInput, StepOutput

SIM_CACHE_DTYPE = "bfloat16"
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


@dataclass(frozen=True, slots=True)
class CostModel:
    """Seconds per unit of work; the defaults look like a 1-3B model on a small GPU."""

    step_s: float = 0.004  # a: fixed cost of one step
    prefill_token_s: float = 0.00005  # b: per uncached prompt token computed
    decode_seq_s: float = 0.0001  # c: per sequence decoding one token
    kv_read_token_s: float = 0.0000001  # d: per KV token read by attention
    lora_swap_s: float = 0.02  # e: per adapter swapped into a slot
    restore_block_s: float = 0.00004  # f: per block restored from the host tier

    @classmethod
    def zero(cls) -> CostModel:
        return cls(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)

    @classmethod
    def parse(cls, text: str) -> CostModel:
        """``"zero"``, ``"default"``, or 4-6 comma-separated seconds ``a,b,c,d[,e[,f]]``."""
        if text == "zero":
            return cls.zero()
        if text == "default":
            return cls()
        try:
            values = [float(v) for v in text.split(",")]
        except ValueError as exc:
            raise ValueError(f"cost model {text!r}: expected numbers a,b,c,d[,e[,f]]") from exc
        if len(values) not in (4, 5, 6) or any(v < 0 for v in values):
            raise ValueError(f"cost model {text!r}: expected 4 to 6 non-negative numbers")
        return cls(*values)

    def step_time(self, step: StepInput, num_lora_swaps: int = 0) -> float:
        prefill_tokens = decode_seqs = kv_tokens = 0
        for seq in step.seqs:
            kv_tokens += seq.num_context_tokens
            if seq.is_decode:
                decode_seqs += 1
            else:
                prefill_tokens += seq.num_new_tokens
        return (
            self.step_s
            + self.prefill_token_s * prefill_tokens
            + self.decode_seq_s * decode_seqs
            + self.kv_read_token_s * kv_tokens
            + self.lora_swap_s * num_lora_swaps
            + self.restore_block_s * step.num_restored_blocks
        )


class SimRunner:
    """A ``ModelRunner`` that sleeps for the cost model's time and emits seeded tokens."""

    def __init__(
        self,
        vocabulary: Seq[int],
        cost: CostModel | None = None,
        *,
        seed: int = 0,
        max_loras: int = 1,
        kv_bytes_per_token: int = 32768,
    ) -> None:
        if not vocabulary:
            raise ValueError("the simulated runner needs a non-empty vocabulary")
        self.vocabulary = list(vocabulary)
        self.cost = cost or CostModel()
        self.seed = seed
        self.max_loras = max_loras
        self.resident_loras: OrderedDict[str, None] = OrderedDict()
        self.num_lora_swaps = 0
        self._seeds: dict[int, int] = {}
        self.kv_bytes_per_token = kv_bytes_per_token
        self.block_size = 16

    def num_kv_blocks(self, block_size: int) -> int | None:
        self.block_size = block_size
        return None  # no KV is kept: the configured number of blocks is simulated

    def bytes_per_block(self) -> int:
        return self.kv_bytes_per_token * self.block_size

    async def read_blocks(self, block_ids: list[int], dtype: str | None) -> BlockData:
        dtype = dtype or SIM_CACHE_DTYPE
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown KV transfer dtype {dtype!r}")
        per_block = self.bytes_per_block() * DTYPE_BYTES[dtype] // DTYPE_BYTES[SIM_CACHE_DTYPE]
        return BlockData(dtype, (0, len(block_ids)), b"", per_block * len(block_ids))

    async def write_blocks(self, block_ids: list[int], blocks: BlockData) -> None:
        if blocks.num_blocks > len(block_ids):
            raise ValueError(f"{blocks.num_blocks} blocks do not fit in {len(block_ids)}")

    async def execute(self, step: StepInput) -> StepOutput:
        swaps = self._make_resident(step.lora_names)
        delay = self.cost.step_time(step, swaps)
        await asyncio.sleep(delay)
        seqs, sample = step.seqs, self._sample
        tokens = [sample(seq) if seq.do_sample else None for seq in seqs]
        accepted = self._verify(step, tokens) if any(s.num_draft_tokens for s in seqs) else None
        wanted = [seq.sampling.prompt_logprobs is not None and not seq.is_decode for seq in seqs]
        if not any(seq.sampling.logprobs for seq in seqs) and not any(wanted):
            return StepOutput(tokens, accepted=accepted)
        asked = [
            self._logprobs(seq, token) if token is not None and seq.sampling.logprobs else None
            for seq, token in zip(seqs, tokens, strict=True)
        ]
        return StepOutput(
            tokens,
            [None if a is None else a[0] for a in asked],
            [None if a is None or not a[1] else a[1] for a in asked],
            [self._prompt_logprobs(s) if w else None for s, w in zip(seqs, wanted, strict=True)],
            accepted,
        )

    def _verify(self, step: StepInput, tokens: list[int | None]) -> list[list[int] | None]:
        """The drafts kept of each sequence given some: each drafted position's token is the
        one this runner draws there (a function of the position), a draft kept while it is that
        token; ``tokens`` then gets the token drawn after the last kept."""
        accepted: list[list[int] | None] = [None] * len(step.seqs)
        for number, seq in enumerate(step.seqs):
            if not seq.num_draft_tokens:
                continue
            drafts = seq.input_ids[len(seq.input_ids) - seq.num_draft_tokens :]
            first = seq.num_context_tokens - seq.num_draft_tokens
            kept = 0
            while kept < len(drafts) and self._sample(seq, first + kept) == drafts[kept]:
                kept += 1
            accepted[number] = drafts[:kept]
            tokens[number] = self._sample(seq, first + kept)
        return accepted

    def is_alive(self) -> bool:
        return True

    def release(self, seq_id: int) -> None:
        self._seeds.pop(seq_id, None)

    async def load_lora(self, name: str, path: str) -> None:
        return None

    def unload_lora(self, name: str) -> None:
        self.resident_loras.pop(name, None)

    def _make_resident(self, names: set[str]) -> int:
        swaps = 0
        for name in names:
            if name in self.resident_loras:
                self.resident_loras.move_to_end(name)
                continue
            if len(self.resident_loras) >= self.max_loras:
                self.resident_loras.popitem(last=False)
            self.resident_loras[name] = None
            swaps += 1
        self.num_lora_swaps += swaps
        return swaps

    def _logprobs(self, seq: SeqStep, token: int) -> tuple[float, TopLogprobs]:
        """Seeded, well-formed log-probabilities: the chosen token's in (-4, 0], and the most
        likely tokens' (the chosen one first, then lower and lower), as many as asked."""
        position = b"logprob" + seq.num_context_tokens.to_bytes(8, "little")
        draw = xxhash.xxh3_64_intdigest(position, seed=self._seeds[seq.seq_id] ^ self.seed)
        chosen = -(draw % 4096) / 1024
        vocabulary = self.vocabulary
        top = [(token, chosen)] + [
            (vocabulary[((draw >> 12) + i) % len(vocabulary)], chosen - 0.5 * i)
            for i in range(1, seq.sampling.top_logprobs)
        ]
        return chosen, tuple(top[: seq.sampling.top_logprobs])

    def _prompt_logprobs(self, seq: SeqStep) -> list[PromptLogprob]:
        """Seeded, well-formed log-probabilities of the prompt tokens whose positions this step
        computes: a rank of 1 to 4, the likeliest tokens above it in steps of 0.5."""
        prompt, vocabulary = seq.prompt_token_ids, self.vocabulary
        seed = xxhash.xxh3_64_intdigest(array("I", prompt).tobytes()) ^ self.seed
        entries: list[PromptLogprob] = []
        for position in range(seq.start_position, min(seq.num_context_tokens, len(prompt) - 1)):
            draw = xxhash.xxh3_64_intdigest(b"prompt" + position.to_bytes(8, "little"), seed=seed)
            rank = 1 + draw % 4
            chosen = -((draw >> 8) % 4096) / 1024 - 0.5 * (rank - 1)
            top = tuple(
                (
                    prompt[position + 1]
                    if i == rank - 1
                    else vocabulary[((draw >> 20) + i) % len(vocabulary)],
                    chosen + 0.5 * (rank - 1 - i),
                )
                for i in range(seq.sampling.prompt_logprobs or 0)
            )
            entries.append((chosen, rank, top))
        return entries

    def _sample(self, seq: SeqStep, context: int | None = None) -> int:
        """The token drawn after ``context`` tokens (the step's whole context unless given)."""
        seq_seed = self._seeds.get(seq.seq_id)
        if seq_seed is None:
            if seq.sampling.seed is not None:
                seq_seed = xxhash.xxh3_64_intdigest(b"seed", seed=seq.sampling.seed & (2**64 - 1))
            else:
                seq_seed = xxhash.xxh3_64_intdigest(array("I", seq.prompt_token_ids).tobytes())
            self._seeds[seq.seq_id] = seq_seed
        position = (context or seq.num_context_tokens).to_bytes(8, "little")
        draw = xxhash.xxh3_64_intdigest(position, seed=seq_seed ^ self.seed)
        return self.vocabulary[draw % len(self.vocabulary)]
