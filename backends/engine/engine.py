"""The asyncio engine loop: schedule a step, run it, hand each request its new tokens.

Torch-free. The runner (simulated or torch) is injected; KV events go to an injected sink and
request latencies to an injected observer, so the server decides how they are exported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from backends.engine.block_manager import BlockManager
from backends.engine.kv_connector import KVConnector
from backends.engine.kv_transfer_params import KVTransferParams
from backends.engine.model_runner import ModelRunner
from backends.engine.scheduler import Scheduler, SchedulerConfig
from backends.engine.sequence import FinishReason, SamplingParams, Sequence
from backends.engine.step import build_step
from kvgate.wire.kv_events import KVEvent

log = logging.getLogger(__name__)


class KVEventSink(Protocol):
    def publish(self, events: list[KVEvent]) -> None:
        """Send one step's KV events (called once per step that produced any)."""
        ...


class LatencyObserver(Protocol):
    def on_first_token(self, seconds: float) -> None: ...
    def on_inter_token(self, seconds: float) -> None: ...
    def on_finished(self, seq: Sequence, e2e_seconds: float) -> None: ...


class RequestStream:
    """The tokens of one request, delivered as they are produced.

    ``next_tokens`` returns the new token ids (several when the consumer fell behind, as vLLM
    merges deltas), and an empty list once the sequence has finished.
    """

    __slots__ = ("_pending", "_sent", "_waiter", "first_token_time", "last_token_time", "seq")

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self._sent = len(seq.prompt_token_ids)  # the sequence's tokens pushed so far
        self._pending: list[int] = []
        self._waiter: asyncio.Future[None] | None = None
        self.first_token_time = 0.0
        self.last_token_time = 0.0

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.seq.finish_reason

    def push_new(self) -> None:
        """The sequence's tokens not pushed yet (one per step, or several where drafts were
        kept)."""
        tokens = self.seq.token_ids
        self._pending.extend(tokens[self._sent :])
        self._sent = len(tokens)
        self._wake()

    def close(self) -> None:
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_tokens(self) -> list[int]:
        """Tokens produced since the last call (waits for some); empty once finished."""
        while not self._pending:
            if self.seq.is_finished:
                return []
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        tokens, self._pending = self._pending, []
        return tokens


class NullObserver:
    def on_first_token(self, seconds: float) -> None:
        return None

    def on_inter_token(self, seconds: float) -> None:
        return None

    def on_finished(self, seq: Sequence, e2e_seconds: float) -> None:
        return None


class AsyncEngine:
    """Continuous batching over a ``Scheduler`` and a ``ModelRunner``."""

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        block_manager: BlockManager,
        runner: ModelRunner,
        *,
        kv_connector: KVConnector | None = None,
        event_sink: KVEventSink | None = None,
        observer: LatencyObserver | None = None,
    ) -> None:
        self.block_manager = block_manager
        self.scheduler = Scheduler(scheduler_config, block_manager, kv_connector)
        self.runner = runner
        self.event_sink = event_sink
        self.observer: LatencyObserver = observer or NullObserver()
        self.num_steps = 0
        self._streams: dict[int, RequestStream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def config(self) -> SchedulerConfig:
        return self.scheduler.config

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="engine-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for stream in list(self._streams.values()):
            self.abort(stream)

    def add_request(
        self,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        *,
        lora_name: str | None = None,
        priority: int = 0,
        request_id: str = "",
        cache_salt: str | None = None,
        kv_transfer: KVTransferParams | None = None,
        parent: RequestStream | None = None,
    ) -> RequestStream:
        """Queue a request (another sample of ``parent``'s prompt, if given: it starts once that
        prompt is computed and shares its cached blocks); raises ValueError if it cannot fit in
        the model's context."""
        max_len = self.config.max_model_len
        if len(prompt_token_ids) + sampling.max_tokens > max_len:
            raise ValueError(
                f"This model's maximum context length is {max_len} tokens. However, you "
                f"requested {len(prompt_token_ids) + sampling.max_tokens} tokens "
                f"({len(prompt_token_ids)} in the prompt, {sampling.max_tokens} to generate)."
            )
        seq = Sequence(
            prompt_token_ids,
            sampling,
            lora_name=lora_name,
            cache_salt=cache_salt,
            priority=priority,
            request_id=request_id,
            kv_transfer=kv_transfer,
            parent=None if parent is None else parent.seq,
        )
        self.scheduler.add(seq)
        stream = RequestStream(seq)
        self._streams[seq.seq_id] = stream
        self._wake.set()
        return stream

    def wake(self) -> None:
        """Have the loop schedule again now (a KV connector's load finished)."""
        self._wake.set()

    def retain(self, stream: RequestStream, ttl: float, owner: str) -> int:
        """Keep ``stream``'s blocks cached through a pause of up to ``ttl`` seconds (a
        session's next call will resend them), within ``owner``'s bound; how many."""
        return self.block_manager.retain(stream.seq.block_hashes, ttl, owner)

    def release(self, stream: RequestStream) -> None:
        """End the pins on ``stream``'s blocks: its session will not be back for them."""
        self.block_manager.release(stream.seq.block_hashes)

    def abort(self, stream: RequestStream) -> None:
        """Stop a request now (client gone); its blocks are freed at once."""
        seq = stream.seq
        if seq.is_finished:
            return
        self.scheduler.abort(seq)
        self._retire(stream, time.monotonic())
        self._wake.set()

    async def _run(self) -> None:
        while True:
            if not self.scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            out = self.scheduler.schedule()
            if out.is_empty:
                if not out.preempted:
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout=0.05)
                continue
            try:
                blocks = self.block_manager
                step = build_step(out.scheduled, blocks.block_size, blocks.take_transfers())
                output = await self.runner.execute(step)
            except Exception:
                log.exception("model runner failed; aborting the batch")
                for item in out.scheduled:
                    stream = self._streams.get(item.seq.seq_id)
                    if stream is not None:
                        self.abort(stream)
                continue
            self.num_steps += 1
            self.scheduler.kv_connector.after_step(step)
            updated = self.scheduler.postprocess(
                out,
                output.tokens,
                output.logprobs,
                output.top_logprobs,
                output.prompt_logprobs,
                output.accepted,
            )
            self._deliver(updated)
            if self.event_sink is not None:
                events = self.block_manager.take_events()
                if events:
                    self.event_sink.publish(events)

    def _deliver(self, updated: list[Sequence]) -> None:
        now = time.monotonic()
        observer = self.observer
        for seq in updated:
            stream = self._streams.get(seq.seq_id)
            if stream is None:
                continue
            if stream.first_token_time == 0.0:
                stream.first_token_time = now
                observer.on_first_token(now - seq.arrival_time)
            else:
                observer.on_inter_token(now - stream.last_token_time)
            stream.last_token_time = now
            stream.push_new()
            if seq.is_finished:
                self._retire(stream, now)

    def _retire(self, stream: RequestStream, now: float) -> None:
        seq = stream.seq
        self._streams.pop(seq.seq_id, None)
        self.runner.release(seq.seq_id)
        self.observer.on_finished(seq, now - seq.arrival_time)
        stream.close()
