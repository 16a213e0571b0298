"""``PdConnector``: the engine's ``KVConnector`` for prefill/decode workers.

Prefill side: a request that carries ``do_remote_decode`` keeps its blocks when it finishes
(``HeldBlocks``, under a lease) and its response names them (``response_params``).
Decode side: a request that carries ``do_remote_prefill`` waits with its blocks allocated while
the blocks it does not already hold (its local prefix-cache hit is never transferred) are
pulled from the prefill worker and written into its cache; then it computes the last prompt
token and decodes. While it waits in the queue its heartbeats keep the lease alive; if it is
cancelled the prefill worker is told to free the blocks. A failed pull leaves the prompt to be
computed here: slower, not failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine

import grpc

from backends.engine.kv_blocks import BlockData, KVBlockIO
from backends.engine.kv_transfer_params import KVTransferParams
from backends.engine.sequence import FinishReason, Sequence
from backends.engine.step import StepInput
from backends.pd.held_blocks import HeldBlocks
from backends.pd.metrics import PdMetrics
from backends.pd.transfer_client import TransferClient

log = logging.getLogger(__name__)


class PdConnector:
    """Holds blocks for remote decodes (``held`` set) and pulls them for remote prefills
    (``client`` set); a worker may do both."""

    def __init__(
        self,
        io: KVBlockIO,
        engine_id: str,
        *,
        lease_seconds: float = 10.0,
        serve_transfers: bool,
        client: TransferClient | None,
        transfer_dtype: str = "",
        metrics: PdMetrics | None = None,
    ) -> None:
        self.io = io
        self.engine_id = engine_id
        self.lease_seconds = lease_seconds
        self.serve_transfers = serve_transfers
        self.client = client
        self.transfer_dtype = transfer_dtype
        self.metrics = metrics
        self.held: HeldBlocks | None = None
        self.host = ""  # where decode workers reach this worker's transfer service
        self.port = 0
        self.block_size = 16
        self._wake: Callable[[], None] = lambda: None
        self._waiting: dict[int, Sequence] = {}  # remote prefills not yet pulled (heartbeats)
        self._loads: dict[int, asyncio.Task[None]] = {}
        self._done: list[int] = []
        self._failed: set[int] = set()
        self._pulled: set[int] = set()  # loaded once: a preempted one is recomputed here
        self._heartbeats: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    def bind(
        self, free: Callable[[Sequence], None], block_size: int, wake: Callable[[], None]
    ) -> None:
        """Attach to the engine: how blocks are freed, their size, how to wake its loop."""
        self.block_size = block_size
        self._wake = wake
        if self.serve_transfers:
            self.held = HeldBlocks(free, self.lease_seconds)

    def start(self) -> None:
        if self.client is not None:
            self._heartbeats = asyncio.create_task(self._beat(), name="kv-heartbeats")

    async def stop(self) -> None:
        tasks = [*self._loads.values(), *([self._heartbeats] if self._heartbeats else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.client is not None:
            await self.client.close()

    # -- scheduler side ---------------------------------------------------------------------
    def on_new_request(self, seq: Sequence) -> None:
        if self._remote_prefill(seq) is not None and seq.seq_id not in self._pulled:
            self._waiting[seq.seq_id] = seq

    def num_external_tokens(self, seq: Sequence, num_local_tokens: int) -> int:
        if self._remote_prefill(seq) is None or seq.seq_id in self._pulled:
            return 0
        return max(0, seq.num_prompt_tokens - num_local_tokens)

    def start_load(self, seq: Sequence, block_ids: list[int], num_external: int) -> None:
        self._waiting.pop(seq.seq_id, None)
        self._pulled.add(seq.seq_id)
        first = seq.num_computed_tokens // self.block_size
        last = -(-(seq.num_computed_tokens + num_external) // self.block_size)
        task = asyncio.get_running_loop().create_task(
            self._load(seq, block_ids, first, last), name=f"kv-pull-{seq.request_id}"
        )
        self._loads[seq.seq_id] = task

    def finished_loads(self) -> list[int]:
        done, self._done = self._done, []
        return done

    def failed(self, seq_id: int) -> bool:
        if seq_id in self._failed:
            self._failed.discard(seq_id)
            return True
        return False

    def request_finished(self, seq: Sequence) -> bool:
        unpulled = self._waiting.pop(seq.seq_id, None) is not None
        self._pulled.discard(seq.seq_id)
        self._failed.discard(seq.seq_id)  # a failed load of a sequence aborted meanwhile
        load = self._loads.pop(seq.seq_id, None)
        if load is not None and not load.done():
            load.cancel()
            unpulled = True
        remote = self._remote_prefill(seq)
        if unpulled and remote is not None:  # the prefill worker still holds them: free them
            self._spawn(self._release(remote))
        params = seq.kv_transfer
        if seq.finish_reason is FinishReason.ABORT:
            return False
        if self.held is None or params is None or not params.do_remote_decode:
            return False
        self.held.hold(self.held_id(seq), seq)
        return True

    def after_step(self, step: StepInput) -> None:
        return None

    # -- prefill side -----------------------------------------------------------------------
    @staticmethod
    def held_id(seq: Sequence) -> str:
        return f"{seq.request_id}~{seq.seq_id}"

    def response_params(self, seq: Sequence) -> KVTransferParams | None:
        """What the prefill response tells the router about ``seq``'s held blocks."""
        held = None if self.held is None else self.held.get(self.held_id(seq))
        if held is None:
            return None
        return KVTransferParams(
            do_remote_prefill=True,
            remote_engine_id=self.engine_id,
            remote_block_ids=held.block_ids,
            remote_host=self.host,
            remote_port=self.port,
            remote_request_id=held.remote_request_id,
        )

    # -- decode side ------------------------------------------------------------------------
    def _remote_prefill(self, seq: Sequence) -> KVTransferParams | None:
        params = seq.kv_transfer
        if self.client is None or params is None or not params.do_remote_prefill:
            return None
        return params

    async def _load(self, seq: Sequence, block_ids: list[int], first: int, last: int) -> None:
        params = seq.kv_transfer
        assert params is not None and self.client is not None
        started, moved = time.perf_counter(), 0
        try:
            if last > len(params.remote_block_ids) and params.remote_block_ids:
                raise ValueError(f"the prefill worker holds {len(params.remote_block_ids)} blocks")
            chunks = self.client.pull(
                _address(params),
                params.remote_engine_id or "",
                params.remote_request_id or "",
                range(first, last),
                self.transfer_dtype,
            )
            writing: asyncio.Future[None] | None = None  # one write while the next arrives
            received = 0
            try:
                async for chunk in chunks:
                    received += chunk.num_blocks
                    start = first + chunk.first
                    data = BlockData(chunk.dtype, chunk.shape, chunk.data, chunk.num_bytes)
                    if writing is not None:
                        await writing
                    target = block_ids[start : start + chunk.num_blocks]
                    writing = asyncio.ensure_future(self.io.write_blocks(target, data))
                    moved += chunk.num_bytes
                if writing is not None:
                    await writing
                    writing = None
                if received != last - first:
                    raise ValueError(f"{received} of {last - first} blocks arrived")
            finally:
                if writing is not None:
                    writing.cancel()
        except asyncio.CancelledError:
            raise
        except (grpc.aio.AioRpcError, ValueError) as exc:
            reason = exc.code().name.lower() if isinstance(exc, grpc.aio.AioRpcError) else "invalid"
            log.warning("KV pull of %s failed (%s): computing it here", seq.request_id, exc)
            self._failed.add(seq.seq_id)
            self._spawn(self._release(params))
            if self.metrics is not None:
                self.metrics.failures.labels(reason).inc()
        else:
            if self.metrics is not None:
                self.metrics.moved("received", last - first, moved, time.perf_counter() - started)
        self._loads.pop(seq.seq_id, None)
        self._done.append(seq.seq_id)
        self._wake()

    def _spawn(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release(self, params: KVTransferParams) -> None:
        assert self.client is not None
        try:
            await self.client.release(
                _address(params), params.remote_engine_id or "", params.remote_request_id or ""
            )
        except grpc.aio.AioRpcError as exc:  # it may be gone: its lease frees them anyway
            log.debug("release of %s failed: %s", params.remote_request_id, exc)

    async def _beat(self) -> None:
        client = self.client
        assert client is not None
        interval = self.lease_seconds / 4
        while True:
            await asyncio.sleep(interval)
            groups: dict[tuple[str, str], list[str]] = {}
            for seq in list(self._waiting.values()):
                params = seq.kv_transfer
                assert params is not None
                key = (_address(params), params.remote_engine_id or "")
                groups.setdefault(key, []).append(params.remote_request_id or "")
            for (address, engine_id), ids in groups.items():
                try:
                    await client.heartbeat(address, engine_id, ids)
                except grpc.aio.AioRpcError as exc:
                    log.debug("heartbeat to %s failed: %s", address, exc)


def _address(params: KVTransferParams) -> str:
    host = params.remote_host or "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{params.remote_port}"
