"""``build_engine``: the engine, sized from its model runner.

The runner comes first because it owns the KV cache's memory: a torch runner's budget decides
how many blocks there are, and the block manager and scheduler are sized from that number (a
runner that keeps no KV, such as the simulated one, leaves the configured count in force).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.engine.block_manager import BlockManager
from backends.engine.engine import AsyncEngine, KVEventSink, LatencyObserver
from backends.engine.kv_connector import KVConnector
from backends.engine.model_runner import ModelRunner
from backends.engine.scheduler import SchedulerConfig


@dataclass(frozen=True, slots=True)
class EngineConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    num_blocks: int = 4096  # KV blocks when the runner does not size the cache itself
    block_size: int = 16  # tokens per KV block
    enable_prefix_caching: bool = True
    hash_seed: int = 0  # seed of the prefix cache's block hashes
    record_events: bool = False  # keep KV events for an event sink
    host_blocks: int = 0  # the host tier's size in blocks (0: none) ...
    host_bytes: int = 0  # ... or in bytes of the runner's KV (vLLM's --kv-offloading-size)
    # the share of the blocks requests' kv.retain hints may keep at once, and one owner's
    retention_fraction: float = 0.5
    retention_owner_fraction: float = 0.25


def build_engine(
    config: EngineConfig,
    runner: ModelRunner,
    *,
    kv_connector: KVConnector | None = None,
    event_sink: KVEventSink | None = None,
    observer: LatencyObserver | None = None,
) -> AsyncEngine:
    """An engine over ``runner`` whose block count is the runner's (or the configured one);
    raises ``ValueError`` when the cache cannot hold one sequence of ``max_model_len``, or for
    a host tier beside a KV connector (its loads write blocks the tier may be moving)."""
    num_blocks = runner.num_kv_blocks(config.block_size) or config.num_blocks
    host_blocks = config.host_blocks
    if config.host_bytes:
        host_blocks = config.host_bytes // max(1, runner.bytes_per_block())
    if host_blocks and kv_connector is not None:
        raise ValueError("a host tier (--cpu-offload-blocks) cannot be used by a PD worker")
    blocks = BlockManager(
        num_blocks,
        config.block_size,
        enable_prefix_caching=config.enable_prefix_caching,
        hash_seed=config.hash_seed,
        record_events=config.record_events,
        host_blocks=host_blocks,
        max_retained=int(num_blocks * config.retention_fraction),
        max_retained_per_owner=int(num_blocks * config.retention_owner_fraction),
    )
    return AsyncEngine(
        config.scheduler,
        blocks,
        runner,
        kv_connector=kv_connector,
        event_sink=event_sink,
        observer=observer,
    )
