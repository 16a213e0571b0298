"""One simulated engine of ``bench.fleet``, in virtual time: the reference backend's own
scheduler and block manager (continuous batching, chunked prefill, paged KV with LRU eviction of
free cached blocks, preemption by recompute) with its simulated runner's cost model, stepped by
the fleet's event loop instead of an asyncio task that sleeps.

A step's duration is ``CostModel.step_time`` of the step the scheduler built, exactly as the
simulated runner would sleep it; sampled tokens are a constant (the length of an answer is its
``max_tokens``, as the trace says). The engine's metrics are what a scrape of the real backend
would read (waiting, running, KV usage); its KV events are the block manager's own, as the real
backend publishes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backends.engine.block_manager import BlockManager
from backends.engine.scheduler import Scheduler, SchedulerConfig
from backends.engine.sequence import SamplingParams, Sequence
from backends.engine.step import build_step
from backends.runners.sim_runner import CostModel
from epp.framework import EndpointMetrics
from epp.service import Dispatch
from kvgate.wire.kv_events import KVEvent

TOKEN = ord("a")  # what every step samples (never the end of a sequence)
BLOCK_SIZE = 16


@dataclass(eq=False, slots=True)
class Flight:
    """One request on one engine: when it arrived and its first token came (virtual s)."""

    seq: Sequence
    arrived: float
    replica: int
    first_token: float = 0.0
    number: int = -1  # its place in the run's arrivals
    dispatch: Dispatch | None = None  # the picker's record of it


@dataclass(eq=False)
class SimEngine:
    """A reference backend (sim runner) whose steps take virtual time."""

    number: int  # its place in the fleet
    address: str
    num_blocks: int
    cost: CostModel
    max_model_len: int
    record_events: bool = False
    scheduler: Scheduler = field(init=False)
    flights: dict[int, Flight] = field(default_factory=dict)
    stepping: bool = False  # a step is under way (its end is on the fleet's clock)
    event_batches: int = 0  # KV-event batches published (their sequence numbers)
    _step: Any = None  # the step under way: the scheduler's output and its samples

    def __post_init__(self) -> None:
        blocks = BlockManager(self.num_blocks, BLOCK_SIZE, record_events=self.record_events)
        config = SchedulerConfig(max_model_len=self.max_model_len)
        self.scheduler = Scheduler(config, blocks)

    @property
    def blocks(self) -> BlockManager:
        return self.scheduler.block_manager

    def add(self, token_ids: list[int], output_tokens: int, now: float, replica: int) -> Flight:
        """Queue a request that arrived ``now``; its tokens are its prompt's ids."""
        room = self.max_model_len - len(token_ids) - 1
        sampling = SamplingParams(max_tokens=max(1, min(output_tokens, room)), ignore_eos=True)
        seq = Sequence(token_ids, sampling, arrival_time=now)
        self.scheduler.add(seq)
        flight = Flight(seq, now, replica)
        self.flights[seq.seq_id] = flight
        return flight

    def step_begin(self) -> float | None:
        """Schedule one step: how long it takes (None: nothing to run now). Its tokens are
        applied by ``step_end``, once its time has passed, as the engine loop does."""
        scheduler = self.scheduler
        if not scheduler.has_work:
            return None
        out = scheduler.schedule()
        if out.is_empty:
            return None
        step = build_step(out.scheduled, BLOCK_SIZE, self.blocks.take_transfers())
        self._step = out, [TOKEN if s.do_sample else None for s in step.seqs]
        return self.cost.step_time(step)

    def step_end(self) -> list[Sequence]:
        """The running step's results: the sequences it gave a token."""
        out, sampled = self._step
        return self.scheduler.postprocess(out, sampled)

    def take_events(self) -> list[KVEvent]:
        return self.blocks.take_events()

    def metrics(self, now: float) -> EndpointMetrics:
        """What a scrape of this engine reads ``now``."""
        scheduler = self.scheduler
        return EndpointMetrics(
            waiting=scheduler.num_waiting,
            running=scheduler.num_running,
            kv_usage=self.blocks.usage,
            block_size=BLOCK_SIZE,
            num_gpu_blocks=self.num_blocks,
            scraped_at=now,
        )
