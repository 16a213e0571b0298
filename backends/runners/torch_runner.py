"""The torch model runner: a real Llama/Qwen2 decoder over a paged KV cache.

Every torch operation, from building the cache to each step, runs on the runner's
``TorchThread``, never on the event loop that serves HTTP and streams tokens: torch releases
the GIL inside its kernels, so the loop keeps answering while a forward pass runs (the
measurements behind this choice are in docs/benchmarks.md). The runner owns the KV cache
(sized from a memory budget through ``num_kv_blocks``), the host tier's copies of blocks the
block manager offloaded (host memory, one tensor per slot, at most the tier's slots), and the
resident adapters.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from backends.engine.host_tier import KVTransfer
from backends.engine.kv_blocks import BlockData
from backends.engine.sequence import PromptLogprob
from backends.engine.step import SeqStep, StepInput, StepOutput
from backends.models.attention import SeqAttention, build_metadata
from backends.models.config import ModelConfig
from backends.models.decoder import Decoder, KVCache
from backends.models.weights import ModelWeights
from backends.runners.lora_weights import LoraRegistry
from backends.runners.sampler import Sampler, SampleRow, prompt_logprobs
from backends.runners.torch_thread import TorchThread

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunnerOptions:
    kv_cache_bytes: int  # memory for K and V of every layer
    max_loras: int = 1  # adapters resident at once (the rest wait in CPU memory)
    max_lora_rank: int = 64
    seed: int = 0  # the shared sampling generator's seed (unseeded requests)
    packed_projections: bool = True  # oneDNN's packed weights where the device allows


class TorchRunner:
    """A ``ModelRunner`` computing each step with the model's real forward pass."""

    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        options: RunnerOptions,
        *,
        eos_token_ids: tuple[int, ...] = (),
        thread: TorchThread | None = None,
    ) -> None:
        """``weights`` should have been made on ``thread`` (see ``build_torch_runner``)."""
        self.config = config
        self.device = weights.embed.device
        self.dtype = weights.embed.dtype
        self.model = Decoder(
            config, weights, self.device, packed_projections=options.packed_projections
        )
        self.options = options
        log.info(
            "projections: %s",
            "oneDNN packed weights" if self.model.projections.packed else "plain matmuls",
        )
        self.sampler = Sampler(eos_token_ids or config.eos_token_ids, options.seed)
        self.loras = LoraRegistry(
            config, options.max_loras, options.max_lora_rank, self.dtype, self.device
        )
        self.cache: KVCache | None = None
        self.host: dict[int, torch.Tensor] = {}  # host slot -> [layers, block_size, 2, ...]
        self.block_size = 0
        self.thread = thread or TorchThread()

    def num_kv_blocks(self, block_size: int) -> int | None:
        return self.thread.call(self._allocate_cache, block_size)

    def _allocate_cache(self, block_size: int) -> int:
        per_block = KVCache.bytes_per_block(self.config, block_size, self.dtype)
        num_blocks = self.options.kv_cache_bytes // per_block
        if num_blocks < 1:
            raise ValueError(
                f"the KV-cache budget of {self.options.kv_cache_bytes} bytes holds no block "
                f"({per_block} bytes per block of {block_size} tokens)"
            )
        self.cache = KVCache(self.config, num_blocks, block_size, self.dtype, self.device)
        self.block_size = block_size
        log.info(
            "KV cache: %d blocks of %d tokens (%d MiB)",
            num_blocks,
            block_size,
            num_blocks * per_block >> 20,
        )
        return num_blocks

    async def execute(self, step: StepInput) -> StepOutput:
        return await self.thread.run(self._step, step)

    def run_step(self, step: StepInput) -> StepOutput:
        """One step, waited for (tests call it directly)."""
        return self.thread.call(self._step, step)

    def _step(self, step: StepInput) -> StepOutput:
        if self.cache is None:
            raise RuntimeError("num_kv_blocks must be called before the first step")
        with torch.inference_mode():
            self._move(step.transfers, self.cache)
            return self._run(step, self.cache)

    def _move(self, transfers: list[KVTransfer], cache: KVCache) -> None:
        """The host tier's moves, in order: an offload copies a device block's KV (every
        layer's) into host memory, a restore copies a host slot's back into a device block."""
        for move in transfers:
            if move.restore:
                kept = self.host[move.host_slot]
                for number, layer in enumerate(cache.layers):
                    self._blocks_of(layer)[move.device_block].copy_(kept[number])
            else:
                held = [self._blocks_of(layer)[move.device_block] for layer in cache.layers]
                self.host[move.host_slot] = torch.stack(held).to("cpu")

    def _run(self, step: StepInput, cache: KVCache) -> StepOutput:
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        attention: list[SeqAttention] = []
        sample_rows: list[int] = []  # the step row of each sampled token's logits
        targets: list[int] = []  # the sequence each of them is for
        rows: list[SampleRow] = []
        # sequences given drafts: their sampling row, and the step rows of their last real
        # token and drafts
        drafted: list[tuple[int, SampleRow, range]] = []
        prompt_rows: list[tuple[int, list[int], list[int]]] = []  # seq, rows, next tokens
        for number, seq in enumerate(step.seqs):
            offset = len(input_ids)
            if seq.sampling.prompt_logprobs is not None and not seq.is_decode:
                prompt_rows.append((number, *_prompt_positions(seq, offset)))
            input_ids.extend(seq.input_ids)
            positions.extend(seq.positions)
            slots.extend(seq.slot_mapping)
            attention.append(
                SeqAttention(seq.block_table, seq.num_context_tokens, offset, seq.num_new_tokens)
            )
            if seq.do_sample:
                num_output = seq.num_context_tokens - len(seq.prompt_token_ids)
                num_output -= seq.num_draft_tokens
                row = SampleRow(seq.seq_id, seq.sampling, num_output)
                if seq.num_draft_tokens:
                    first = len(input_ids) - 1 - seq.num_draft_tokens
                    drafted.append((number, row, range(first, len(input_ids))))
                else:
                    sample_rows.append(len(input_ids) - 1)
                    targets.append(number)
                    rows.append(row)
        device = self.device
        groups = self.config.num_attention_heads // self.config.num_key_value_heads
        meta = build_metadata(attention, slots, step.block_size, device, groups, self.dtype)
        lora = self.loras.batch(step.seqs) if step.lora_names else None
        hidden = self.model.hidden_states(
            torch.tensor(input_ids, dtype=torch.long, device=device),
            torch.tensor(positions, dtype=torch.long, device=device),
            meta,
            cache,
            lora,
        )
        of_prompts = self._prompt_logprobs(step, hidden, prompt_rows) if prompt_rows else None
        chosen = sample_rows + [r for _, _, span in drafted for r in span]
        if not chosen:
            return StepOutput([None] * len(step.seqs), prompt_logprobs=of_prompts)
        logits = self.model.logits(hidden[torch.tensor(chosen, device=device)])
        return self._sampled(step, logits, rows, targets, drafted, of_prompts)

    def _sampled(
        self,
        step: StepInput,
        logits: torch.Tensor,
        rows: list[SampleRow],
        targets: list[int],
        drafted: list[tuple[int, SampleRow, range]],
        of_prompts: list[list[PromptLogprob] | None] | None,
    ) -> StepOutput:
        """The step's tokens from the logits of its sampled rows: the plain rows (first,
        ``targets`` their sequences) sampled as a batch, then each drafted sequence's rows
        checked against its drafts (``Sampler.verify``)."""
        size = len(step.seqs)
        tokens: list[int | None] = [None] * size
        logprobs = tops = None
        if rows:
            sampled = self.sampler.sample(logits[: len(rows)], rows)
            tokens = _placed(sampled.tokens, targets, size)
            if sampled.logprobs is not None:
                logprobs = _placed(sampled.logprobs, targets, size)
            if sampled.top_logprobs is not None:
                tops = _placed(sampled.top_logprobs, targets, size)
        accepted: list[list[int] | None] | None = None
        if drafted:
            accepted = [None] * size
            at = len(rows)
            for number, row, span in drafted:
                drafts = step.seqs[number].input_ids[-step.seqs[number].num_draft_tokens :]
                kept, token = self.sampler.verify(logits[at : at + len(span)], row, drafts)
                accepted[number], tokens[number] = kept, token
                at += len(span)
        return StepOutput(tokens, logprobs, tops, of_prompts, accepted)

    def _prompt_logprobs(
        self,
        step: StepInput,
        hidden: torch.Tensor,
        prompt_rows: list[tuple[int, list[int], list[int]]],
    ) -> list[list[PromptLogprob] | None]:
        """The prompt tokens' log-probabilities from this step's logits at their positions
        (each sequence that asks, a row per prompt position it computes)."""
        placed: list[list[PromptLogprob] | None] = [None] * len(step.seqs)
        for number, positions, next_tokens in prompt_rows:
            if positions:
                logits = self.model.logits(hidden[torch.tensor(positions, device=self.device)])
                top = step.seqs[number].sampling.prompt_logprobs or 0
                placed[number] = prompt_logprobs(logits, next_tokens, top)
        return placed

    def bytes_per_block(self) -> int:
        return KVCache.bytes_per_block(self.config, self.block_size, self.dtype)

    async def read_blocks(self, block_ids: list[int], dtype: str | None) -> BlockData:
        return await self.thread.run(self.read_blocks_now, block_ids, dtype)

    async def write_blocks(self, block_ids: list[int], blocks: BlockData) -> None:
        await self.thread.run(self.write_blocks_now, block_ids, blocks)

    def read_blocks_now(self, block_ids: list[int], dtype: str | None) -> BlockData:
        """``read_blocks`` on the calling thread (the torch thread, or an engine process)."""
        cache = self._cache()
        target = _torch_dtype(dtype) if dtype else self.dtype
        index = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            first = self._blocks_of(cache.layers[0])
            blocks = torch.empty(
                (len(cache.layers), len(block_ids), *first.shape[1:]),
                dtype=self.dtype,
                device=self.device,
            )
            for number, layer in enumerate(cache.layers):
                torch.index_select(self._blocks_of(layer), 0, index, out=blocks[number])
            flat = blocks.to(target).reshape(-1).view(torch.uint8).cpu()
        name = str(target).removeprefix("torch.")
        # a view of the gathered tensor: whoever sends it copies it once, into its message
        data = memoryview(flat.numpy())  # type: ignore[arg-type]
        return BlockData(name, tuple(blocks.shape), data, flat.numel())

    def write_blocks_now(self, block_ids: list[int], blocks: BlockData) -> None:
        """``write_blocks`` on the calling thread."""
        cache = self._cache()
        layers, count, *block_shape = blocks.shape
        expected = list(self._blocks_of(cache.layers[0]).shape[1:])
        if layers != len(cache.layers) or block_shape != expected or count > len(block_ids):
            raise ValueError(
                f"KV of shape {list(blocks.shape)} does not fit this cache "
                f"([{len(cache.layers)}, <= {len(block_ids)}, {', '.join(map(str, expected))}])"
            )
        with warnings.catch_warnings():  # read only: the bytes are copied into the cache
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            raw = torch.frombuffer(blocks.data, dtype=torch.uint8)
        source = raw.view(_torch_dtype(blocks.dtype)).reshape(blocks.shape)
        index = torch.tensor(block_ids[:count], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            values = source.to(self.device, self.dtype)
            for number, layer in enumerate(cache.layers):
                self._blocks_of(layer).index_copy_(0, index, values[number])

    def _cache(self) -> KVCache:
        if self.cache is None:
            raise RuntimeError("num_kv_blocks must be called before the cache is used")
        return self.cache

    def _blocks_of(self, layer: torch.Tensor) -> torch.Tensor:
        return layer.view(-1, self.block_size, *layer.shape[1:])

    def is_alive(self) -> bool:
        return True

    def release(self, seq_id: int) -> None:
        self.sampler.release(seq_id)

    async def load_lora(self, name: str, path: str) -> None:
        await self.thread.run(self.loras.load, name, path)

    def load_lora_now(self, name: str, path: str) -> None:
        """``load_lora`` at start-up, before the event loop runs."""
        self.thread.call(self.loras.load, name, path)

    def unload_lora(self, name: str) -> None:
        self.loras.unload(name)

    def close(self) -> None:
        self.thread.close()


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"unknown KV transfer dtype {name!r}")
    return dtype


def _placed(values: list[Any], targets: list[int], size: int) -> list[Any]:
    """``values`` (one per sampling row) at their sequences' places among ``size``; None
    elsewhere."""
    placed: list[Any] = [None] * size
    for index, value in zip(targets, values, strict=True):
        placed[index] = value
    return placed


def _prompt_positions(seq: SeqStep, offset: int) -> tuple[list[int], list[int]]:
    """The step rows (from ``offset``) of ``seq``'s positions whose next token is a prompt
    token, and those tokens."""
    prompt = seq.prompt_token_ids
    start = seq.start_position
    last = min(seq.num_context_tokens, len(prompt) - 1)  # positions before a prompt token
    return [offset + p - start for p in range(start, last)], prompt[start + 1 : last + 1]
