"""Continuous-batching scheduler with chunked prefill and preemption by recompute.

Each step spends a token budget (``max_num_batched_tokens``): first on running sequences, oldest
first (one token for a decode, the rest of the prompt, or a chunk of it, for a prefill), then on
admitting waiting sequences in (priority, arrival) order, reusing their cached prefix blocks.
When a running sequence cannot get a block, the newest lowest-priority sequence not yet scheduled
in this step is preempted: its blocks are freed (their cached contents survive until evicted)
and it goes back to the waiting queue to be recomputed.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

from backends.engine.block_manager import BlockManager
from backends.engine.kv_connector import KVConnector, NoKVConnector
from backends.engine.sequence import (
    FinishReason,
    PromptLogprob,
    Sequence,
    SequenceStatus,
    TopLogprobs,
)
from backends.engine.speculation import SpeculationStats, SpeculativeConfig, drafts_for
from backends.engine.step import ScheduledSeq


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The scheduler's limits: token budget per step, sequences per step, chunking."""

    max_num_seqs: int = 256  # sequences in one batch
    max_num_batched_tokens: int = 4096  # tokens computed in one step
    max_model_len: int = 8192  # prompt + output tokens of one sequence
    enable_chunked_prefill: bool = True  # split long prompts across steps
    max_loras: int = 1  # distinct LoRA adapters in one batch
    eos_token_ids: tuple[int, ...] = ()  # the model's end-of-sequence tokens
    speculative: SpeculativeConfig | None = None  # draft tokens for decoding sequences

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "max_loras"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "without chunked prefill, max_num_batched_tokens must be >= max_model_len"
            )


@dataclass(slots=True)
class SchedulerOutput:
    """What one step runs: the sequences scheduled, and those preempted."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(slots=True)
class SchedulerStats:
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of which were found cached
    prompt_tokens: int = 0
    generation_tokens: int = 0


class Scheduler:
    """Decides each step which sequences compute how many tokens (continuous batching).

    ``schedule`` returns the step; ``postprocess`` applies the runner's samples. Sequences
    wait, run, or — with a ``KVConnector`` that can load part of a prompt's KV — wait for that
    load with their blocks allocated; ``abort`` stops one wherever it is.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        kv_connector: KVConnector | None = None,
    ) -> None:
        capacity = block_manager.num_blocks * block_manager.block_size
        if config.max_model_len > capacity:
            raise ValueError(
                f"max_model_len {config.max_model_len} exceeds the KV cache "
                f"({block_manager.num_blocks} blocks x {block_manager.block_size} tokens)"
            )
        self.config = config
        self.block_manager = block_manager
        self.waiting: list[tuple[tuple[int, float, int], Sequence]] = []
        self.running: list[Sequence] = []
        self.loading: dict[int, tuple[Sequence, int]] = {}  # seq id -> (seq, tokens loading)
        self.kv_connector: KVConnector = kv_connector or NoKVConnector()
        self.stats = SchedulerStats()
        self.speculation = SpeculationStats()

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.loading)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.loading)

    def add(self, seq: Sequence) -> None:
        if seq.num_tokens >= self.config.max_model_len:
            raise ValueError(
                f"prompt has {seq.num_tokens} tokens; the context is {self.config.max_model_len}"
            )
        seq.status = SequenceStatus.WAITING
        heapq.heappush(self.waiting, (seq.sort_key(), seq))
        self.kv_connector.on_new_request(seq)

    def abort(self, seq: Sequence) -> None:
        """Stop ``seq`` wherever it is and free its blocks; a finished sequence is ignored."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.block_manager.free(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting = [entry for entry in self.waiting if entry[1] is not seq]
            heapq.heapify(self.waiting)
        elif seq.status is SequenceStatus.WAITING_FOR_REMOTE_KV:
            self.loading.pop(seq.seq_id, None)
            self.block_manager.free(seq)
        else:
            return
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = FinishReason.ABORT
        self.kv_connector.request_finished(seq)

    def schedule(self) -> SchedulerOutput:
        if self.loading:
            self._finish_loads()
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_running(out, budget)
        if not out.preempted:
            self._admit_waiting(out, budget)
        return out

    def postprocess(
        self,
        out: SchedulerOutput,
        sampled: list[int | None],
        logprobs: list[float | None] | None = None,
        top_logprobs: list[TopLogprobs | None] | None = None,
        prompt_logprobs: list[list[PromptLogprob] | None] | None = None,
        accepted: list[list[int] | None] | None = None,
    ) -> list[Sequence]:
        """Apply a step's results; ``sampled`` (and ``logprobs``, ``top_logprobs``,
        ``prompt_logprobs``, ``accepted``: the drafts each sequence's sampling kept, which come
        before its sampled token) align with ``out.scheduled``.

        Returns the sequences that got new tokens or finished in this step.
        """
        updated: list[Sequence] = []
        any_finished = False
        running = SequenceStatus.RUNNING
        for index, (item, token) in enumerate(zip(out.scheduled, sampled, strict=True)):
            seq = item.seq
            if seq.status is not running:
                continue  # aborted while the step ran
            if prompt_logprobs is not None and (entries := prompt_logprobs[index]):
                # entry i is position i's: a recomputed prompt (preempted) replaces its own
                del seq.prompt_logprobs[seq.num_computed_tokens :]
                seq.prompt_logprobs.extend(entries)
            kept = (accepted[index] if accepted is not None else None) or []
            if item.draft_token_ids:
                self.speculation.record(len(item.draft_token_ids), len(kept))
            seq.num_computed_tokens += item.num_new_tokens + len(kept)  # kept drafts' KV too
            if token is None:
                continue
            finished = any(self._append(seq, draft) for draft in kept)
            if not finished:
                logprob = logprobs[index] if logprobs is not None else None
                top = top_logprobs[index] if top_logprobs is not None else None
                finished = self._append(seq, token, logprob, top)
            any_finished |= finished
            updated.append(seq)
        if any_finished:
            self.running = [s for s in self.running if s.status is SequenceStatus.RUNNING]
        return updated

    def _append(
        self,
        seq: Sequence,
        token: int,
        logprob: float | None = None,
        top: TopLogprobs | None = None,
    ) -> bool:
        """One new token of ``seq`` (with its log-probabilities where asked); whether that
        finished it (its blocks then freed, unless the KV connector still sends them)."""
        stats = self.stats
        num_prompt = len(seq.prompt_token_ids)
        if len(seq.token_ids) == num_prompt:
            stats.prompt_tokens += num_prompt
        seq.token_ids.append(token)
        if logprob is not None:
            seq.output_logprobs.append(logprob)
        if top is not None:
            seq.output_top_logprobs.append(top)
        stats.generation_tokens += 1
        reason = self._finish_reason(seq, token)
        if reason is None:
            return False
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        if not self.kv_connector.request_finished(seq):
            self.block_manager.free(seq)  # else the connector frees them later
        return True

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        sampling = seq.sampling
        num_tokens = len(seq.token_ids)
        num_output = num_tokens - len(seq.prompt_token_ids)
        if num_output > sampling.min_tokens:  # a stop token counts after min_tokens
            if not sampling.ignore_eos and token in self.config.eos_token_ids:
                return FinishReason.STOP
            if token in sampling.stop_token_ids:
                return FinishReason.STOP
        if num_output >= sampling.max_tokens:
            return FinishReason.LENGTH
        if num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num_new = min(len(seq.token_ids) - seq.num_computed_tokens, budget)
            drafts = self._drafts(seq, num_new, budget)
            if self._make_room(seq, num_new, index, out):
                self.block_manager.append(seq, num_new, lookahead=len(drafts))
                out.scheduled.append(ScheduledSeq(seq, num_new, drafts))
                budget -= num_new + len(drafts)
                index += 1
        return budget

    def _drafts(self, seq: Sequence, num_new: int, budget: int) -> list[int]:
        """Draft tokens for a decoding ``seq`` (speculative decoding), as many as fit in free
        blocks: drafts never preempt another sequence."""
        config = self.config.speculative
        if config is None or num_new != 1 or seq.num_computed_tokens != seq.num_tokens - 1:
            return []
        drafts = drafts_for(seq, config, budget, self.config.max_model_len)
        if drafts and not self.block_manager.can_append(seq, 1 + len(drafts)):
            return []
        return drafts

    def _make_room(self, seq: Sequence, num_new: int, index: int, out: SchedulerOutput) -> bool:
        """Preempt until ``seq`` can grow; False if ``seq`` itself had to be preempted."""
        while not self.block_manager.can_append(seq, num_new):
            victim = max(self.running[index:], key=Sequence.sort_key)
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.stats.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        heapq.heappush(self.waiting, (seq.sort_key(), seq))

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        skipped: list[tuple[tuple[int, float, int], Sequence]] = []
        active_loras = {s.lora_name for s in self.running if s.lora_name}
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0][1]
            lora = seq.lora_name
            if lora and lora not in active_loras and len(active_loras) >= self.config.max_loras:
                skipped.append(heapq.heappop(self.waiting))
                continue
            if seq.waits_for_parent():  # its prompt's blocks are on their way into the cache
                skipped.append(heapq.heappop(self.waiting))
                continue
            cached, num_cached = self.block_manager.get_computed_blocks(seq)
            if self._start_load(seq, cached, num_cached):
                continue
            num_new = seq.num_tokens - num_cached
            if num_new > budget:
                if not self.config.enable_chunked_prefill:
                    break
                num_new = budget
            if not self.block_manager.can_allocate(seq, cached, num_new):
                break
            heapq.heappop(self.waiting)
            self.block_manager.allocate(seq, cached, num_new)
            self.stats.prefix_cache_queries += seq.num_tokens
            self.stats.prefix_cache_hits += num_cached
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = num_cached
            if not seq.scheduled_time:
                seq.scheduled_time = time.monotonic()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            if lora:
                active_loras.add(lora)
            out.scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
        for entry in skipped:
            heapq.heappush(self.waiting, entry)

    def _start_load(self, seq: Sequence, cached: list[int], num_cached: int) -> bool:
        """Hand the tokens the connector can load to it; True if ``seq`` now waits for them."""
        num_external = min(
            self.kv_connector.num_external_tokens(seq, num_cached),
            seq.num_tokens - num_cached - 1,  # the last token is computed here, to sample
        )
        if num_external <= 0 or not self.block_manager.can_allocate(seq, cached, num_external):
            return False
        heapq.heappop(self.waiting)
        seq.scheduled_time = seq.scheduled_time or time.monotonic()
        self.block_manager.allocate(seq, cached, 0)
        self.block_manager.reserve(seq, num_external)
        self.stats.prefix_cache_queries += seq.num_tokens
        self.stats.prefix_cache_hits += num_cached
        seq.status = SequenceStatus.WAITING_FOR_REMOTE_KV
        self.loading[seq.seq_id] = (seq, num_external)
        self.kv_connector.start_load(seq, list(seq.block_table), num_external)
        return True

    def _finish_loads(self) -> None:
        """Sequences whose KV arrived run from the first token not loaded (all of theirs, if
        the load failed: they are computed here)."""
        connector = self.kv_connector
        for seq_id in connector.finished_loads():
            entry = self.loading.pop(seq_id, None)
            if entry is None:
                continue  # aborted meanwhile
            seq, num_external = entry
            if not connector.failed(seq_id):
                self.block_manager.append(seq, num_external)
                seq.num_computed_tokens += num_external
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = seq.num_computed_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
