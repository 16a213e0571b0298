"""``make bench-pd``, part one: KV transfer throughput between two worker processes on
loopback, beside a raw loopback TCP stream's throughput measured in the same run (the floor
here: what the kernel's loopback moves for one sender and one reader, with no framing).

Each round prefills a fresh prompt on a prefill worker (torch runner, float32 cache) and then
moves its KV three ways: into a decode worker's paged cache (the product path: gRPC stream,
the prefill worker's block gather, the decode worker's scatter; timed by the decode worker's
``kvgate:kv_transfer_seconds``), into decode workers asking for float16 and float8_e4m3fn
(half and a quarter of the bytes), and to a bare gRPC client that discards it. Beside them, the
same volume as opaque messages on one gRPC stream between two processes: Python grpc's own
throughput, the library floor under any gRPC transfer.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import grpc
from prometheus_client.parser import text_string_to_metric_families

from backends.pd.transfer_client import TransferClient
from backends.pd.transfer_service import GRPC_OPTIONS

CHUNK = 4 * 2**20


def _read_all(port_queue: multiprocessing.Queue[int], total: int) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port_queue.put(server.getsockname()[1])
        conn, _ = server.accept()
        with conn:
            buffer = bytearray(CHUNK)
            view, received = memoryview(buffer), 0
            while received < total:
                count = conn.recv_into(view)
                if not count:
                    break
                received += count
            conn.sendall(b"k")


def raw_socket_bytes_per_s(total: int) -> float:
    """One sender streaming ``total`` bytes to a reader process over loopback TCP."""
    context = multiprocessing.get_context("spawn")
    ports: multiprocessing.Queue[int] = context.Queue()
    reader = context.Process(target=_read_all, args=(ports, total), daemon=True)
    reader.start()
    try:
        with socket.create_connection(("127.0.0.1", ports.get(timeout=30))) as conn:
            payload = memoryview(bytes(CHUNK))
            started, sent = time.perf_counter(), 0
            while sent < total:
                conn.sendall(payload)
                sent += CHUNK
            conn.recv(1)
            return sent / (time.perf_counter() - started)
    finally:
        reader.join(timeout=10)


def _grpc_bytes_server(port_queue: multiprocessing.Queue[int], total: int) -> None:
    payload = bytes(CHUNK)

    async def pull(request: bytes, context: object) -> AsyncIterator[bytes]:
        for _ in range(total // CHUNK):
            yield payload

    async def serve() -> None:
        server = grpc.aio.server(options=GRPC_OPTIONS)
        method = grpc.unary_stream_rpc_method_handler(pull)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("floor.Floor", {"Pull": method}),)
        )
        port_queue.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(serve())


def grpc_stream_bytes_per_s(total: int) -> float:
    """Opaque ``CHUNK``-byte messages on one gRPC stream between two processes (Python's grpc,
    no protobuf, no KV): the floor the library sets under the KV transfer."""
    context = multiprocessing.get_context("spawn")
    ports: multiprocessing.Queue[int] = context.Queue()
    server = context.Process(target=_grpc_bytes_server, args=(ports, total), daemon=True)
    server.start()

    async def pull(port: int) -> float:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
            call = channel.unary_stream("/floor.Floor/Pull")
            started, moved = time.perf_counter(), 0
            async for message in call(b""):
                moved += len(message)
            return moved / (time.perf_counter() - started)

    try:
        return asyncio.run(pull(ports.get(timeout=30)))
    finally:
        server.kill()
        server.join(timeout=10)


@dataclass(frozen=True, slots=True)
class Moved:
    num_bytes: float
    seconds: float

    @property
    def bytes_per_s(self) -> float:
        return self.num_bytes / self.seconds if self.seconds else 0.0


def prompt_ids(tokens: int, vocab: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, vocab) for _ in range(tokens)]


async def _prefill(
    session: aiohttp.ClientSession, prefill: str, model: str, prompt: list[int]
) -> dict[str, object]:
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0,
            "kv_transfer_params": {"do_remote_decode": True}}  # fmt: skip
    async with session.post(f"{prefill}/v1/completions", json=body) as response:
        reply = await response.json()
        if response.status != 200:
            raise RuntimeError(f"prefill failed: {reply}")
    params: dict[str, object] = reply["kv_transfer_params"]
    return params


async def into_decode_worker(
    session: aiohttp.ClientSession, prefill: str, decode: str, model: str, prompt: list[int]
) -> Moved:
    """Prefill ``prompt``, then have ``decode`` pull it; the decode worker's own timing."""
    params = await _prefill(session, prefill, model, prompt)
    before = await _received(session, decode)
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "kv_transfer_params": params}
    async with session.post(f"{decode}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"decode failed: {await response.text()}")
        await response.read()
    after = await _received(session, decode)
    return Moved(after[0] - before[0], after[1] - before[1])


async def _received(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    labels = {"direction": "received"}
    return (
        metric_sum(text, "kvgate:kv_transfer_bytes_total", labels),
        metric_sum(text, "kvgate:kv_transfer_seconds_sum", labels),
    )


async def to_bare_client(
    session: aiohttp.ClientSession, prefill: str, model: str, prompt: list[int]
) -> Moved:
    """Prefill ``prompt``, then pull its blocks with a gRPC client that keeps nothing."""
    params = await _prefill(session, prefill, model, prompt)
    block_ids = params["remote_block_ids"]
    assert isinstance(block_ids, list)
    client = TransferClient()
    try:
        started, moved = time.perf_counter(), 0
        async for chunk in client.pull(
            f"{params['remote_host']}:{params['remote_port']}",
            str(params["remote_engine_id"]),
            str(params["remote_request_id"]),
            range(len(block_ids)),
        ):
            moved += len(chunk.data)
        return Moved(moved, time.perf_counter() - started)
    finally:
        await client.close()


def metric_sum(text: str, name: str, labels: dict[str, str]) -> float:
    """The sum of a metric's samples (wire name) whose labels include ``labels``."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )
