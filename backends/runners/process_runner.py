"""The torch runner in an engine process of its own, behind the same ``ModelRunner`` contract.

The serving process keeps the engine core (scheduler, block manager, streams); each step's
typed input crosses a pipe to a child process whose main thread runs the torch runner, and
the step's output comes back. The alternative to ``TorchRunner``'s in-process thread; which
one ``kvgate backend`` uses, and why, is measured in docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from backends.engine.kv_blocks import BlockData
from backends.engine.step import StepInput, StepOutput
from backends.models.config import ModelConfig
from backends.runners.torch_setup import TorchModelSpec, build_torch_runner


def _serve(conn: Connection, spec: TorchModelSpec, eos_token_ids: tuple[int, ...]) -> None:
    """The engine process: build the runner on this (main) thread, then answer requests."""
    try:
        runner = build_torch_runner(spec, eos_token_ids, inline=True)
    except Exception as exc:  # reported to the parent, which raises it at start-up
        conn.send(("error", exc))
        return
    conn.send(("ok", runner.config))
    handlers: dict[str, Any] = {
        "blocks": runner.num_kv_blocks,
        "step": runner.run_step,
        "read_blocks": lambda ids, dtype: _picklable(runner.read_blocks_now(ids, dtype)),
        "write_blocks": runner.write_blocks_now,
        "bytes_per_block": runner.bytes_per_block,
        "release": runner.release,
        "load_lora": runner.loras.load,
        "unload_lora": runner.unload_lora,
    }
    while True:
        try:
            kind, args = conn.recv()
        except EOFError:
            return
        if kind == "stop":
            return
        try:
            conn.send(("ok", handlers[kind](*args)))
        except Exception as exc:  # the parent re-raises it where it called
            conn.send(("error", exc))


def _picklable(blocks: BlockData) -> BlockData:
    """``blocks`` with its data as bytes (a view cannot cross the pipe)."""
    if isinstance(blocks.data, memoryview):
        return dataclasses.replace(blocks, data=bytes(blocks.data))
    return blocks


class ProcessRunner:
    """A ``ModelRunner`` whose torch runner lives in a child process."""

    def __init__(self, spec: TorchModelSpec, eos_token_ids: tuple[int, ...] = ()) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child, spec, eos_token_ids), name="kvgate-engine", daemon=True
        )
        self._process.start()
        child.close()
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-pipe")
        self.config: ModelConfig = self._reply()

    def _reply(self) -> Any:
        try:
            status, value = self._conn.recv()
        except EOFError:
            raise RuntimeError("the engine process exited") from None
        if status == "error":
            raise value
        return value

    def _call(self, kind: str, *args: object) -> Any:
        self._conn.send((kind, args))
        return self._reply()

    def num_kv_blocks(self, block_size: int) -> int | None:
        blocks: int | None = self._call("blocks", block_size)
        return blocks

    async def execute(self, step: StepInput) -> StepOutput:
        loop = asyncio.get_running_loop()
        output: StepOutput = await loop.run_in_executor(self._io, self._call, "step", step)
        return output

    def bytes_per_block(self) -> int:
        size: int = self._io.submit(self._call, "bytes_per_block").result()
        return size

    async def read_blocks(self, block_ids: list[int], dtype: str | None) -> BlockData:
        loop = asyncio.get_running_loop()
        data: BlockData = await loop.run_in_executor(
            self._io, self._call, "read_blocks", block_ids, dtype
        )
        return data

    async def write_blocks(self, block_ids: list[int], blocks: BlockData) -> None:
        blocks = _picklable(blocks)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._io, self._call, "write_blocks", block_ids, blocks)

    def is_alive(self) -> bool:
        return self._process.is_alive()

    def release(self, seq_id: int) -> None:
        self._io.submit(self._call, "release", seq_id)

    async def load_lora(self, name: str, path: str) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._io, self._call, "load_lora", name, path)

    def load_lora_now(self, name: str, path: str) -> None:
        self._io.submit(self._call, "load_lora", name, path).result()

    def unload_lora(self, name: str) -> None:
        self._io.submit(self._call, "unload_lora", name)

    def close(self) -> None:
        self._io.submit(self._conn.send, ("stop", ())).result()
        self._io.shutdown(wait=True)
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
