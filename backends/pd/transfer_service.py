"""The prefill worker's gRPC ``KVTransfer`` service: decode workers pull held blocks.

A pull streams the requested blocks in chunks of about ``chunk_bytes`` (HTTP/2 flow control
paces the stream to the reader) and frees the request's blocks once its last chunk is sent.
Heartbeats renew leases; a release frees a request's blocks at once. A request whose lease
lapses is freed by the expiry loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from backends.engine.kv_blocks import BlockData, KVBlockIO
from backends.pd.chunk_codec import encode_chunk
from backends.pd.held_blocks import HeldBlocks
from backends.pd.metrics import PdMetrics
from kvgate.api import kv_transfer_pb2 as pb

log = logging.getLogger(__name__)
CHUNK_BYTES = 4 * 2**20
MAX_MESSAGE = 64 * 2**20
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
]


SERVICE = pb.DESCRIPTOR.services_by_name["KVTransfer"].full_name


class KVTransferService:
    """``KVTransfer``'s methods; ``handler`` registers them (``Pull`` streams chunks it
    encodes itself: ``chunk_codec``)."""

    def __init__(
        self,
        engine_id: str,
        held: HeldBlocks,
        io: KVBlockIO,
        metrics: PdMetrics,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.engine_id = engine_id
        self.held = held
        self.io = io
        self.metrics = metrics
        self.chunk_bytes = chunk_bytes

    async def Pull(
        self, request: pb.PullRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        await self._check_engine(request.remote_engine_id, context)
        held = self.held.get(request.remote_request_id)
        if held is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"request {request.remote_request_id!r} is not held (pulled, released or expired)",
            )
            return
        indexes = list(request.block_indexes)
        if any(i >= len(held.block_ids) for i in indexes):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"block indexes beyond the {len(held.block_ids)} blocks held",
            )
        per_chunk = max(1, self.chunk_bytes // max(1, self.io.bytes_per_block()))
        pieces = [indexes[i : i + per_chunk] for i in range(0, len(indexes), per_chunk)]
        started, sent_bytes = time.perf_counter(), 0
        held.pulling = True
        reading = self._read(held.block_ids, pieces[0], request.dtype) if pieces else None
        try:
            for number, piece in enumerate(pieces):
                assert reading is not None  # each piece's read was started before its turn
                try:
                    blocks = await reading
                except ValueError as exc:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                    return
                reading = None
                if number + 1 < len(pieces):  # the next chunk is read while this one is sent
                    reading = self._read(held.block_ids, pieces[number + 1], request.dtype)
                sent_bytes += blocks.num_bytes
                yield encode_chunk(
                    number * per_chunk,
                    len(piece),
                    blocks.dtype,
                    blocks.shape,
                    blocks.data,
                    blocks.num_bytes,
                )
        finally:
            held.pulling = False
            if reading is not None:
                reading.cancel()
        self.held.release(request.remote_request_id)
        self.metrics.moved("sent", len(indexes), sent_bytes, time.perf_counter() - started)

    def _read(
        self, block_ids: tuple[int, ...], piece: list[int], dtype: str
    ) -> asyncio.Future[BlockData]:
        return asyncio.ensure_future(
            self.io.read_blocks([block_ids[i] for i in piece], dtype or None)
        )

    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.HeartbeatResponse:
        if request.remote_engine_id and request.remote_engine_id != self.engine_id:
            return pb.HeartbeatResponse(unknown_request_ids=list(request.remote_request_ids))
        unknown = [r for r in request.remote_request_ids if not self.held.renew(r)]
        return pb.HeartbeatResponse(unknown_request_ids=unknown)

    async def Release(
        self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ReleaseResponse:
        await self._check_engine(request.remote_engine_id, context)
        return pb.ReleaseResponse(released=self.held.release(request.remote_request_id))

    async def _check_engine(
        self, engine_id: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        if engine_id and engine_id != self.engine_id:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"engine {engine_id!r} is not this worker's ({self.engine_id}): it restarted",
            )


def handler(service: KVTransferService) -> grpc.GenericRpcHandler:
    """The ``KVTransfer`` service's methods, as the generated code would register them, except
    that ``Pull``'s messages are already encoded."""
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Pull": grpc.unary_stream_rpc_method_handler(
                service.Pull, request_deserializer=pb.PullRequest.FromString
            ),
            "Heartbeat": grpc.unary_unary_rpc_method_handler(
                service.Heartbeat,
                request_deserializer=pb.HeartbeatRequest.FromString,
                response_serializer=pb.HeartbeatResponse.SerializeToString,
            ),
            "Release": grpc.unary_unary_rpc_method_handler(
                service.Release,
                request_deserializer=pb.ReleaseRequest.FromString,
                response_serializer=pb.ReleaseResponse.SerializeToString,
            ),
        },
    )


class TransferServer:
    """The ``KVTransfer`` gRPC server and the loop that frees lapsed leases."""

    def __init__(self, service: KVTransferService, host: str, port: int) -> None:
        self.service = service
        self.host = host
        self.port = port
        self._server: grpc.aio.Server | None = None
        self._expiry: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Serve; returns the bound port (``port`` 0 picks a free one)."""
        server = grpc.aio.server(options=GRPC_OPTIONS)
        server.add_generic_rpc_handlers((handler(self.service),))
        self.port = server.add_insecure_port(f"{self.host}:{self.port}")
        await server.start()
        self._server = server
        self._expiry = asyncio.create_task(self._expire_leases(), name="kv-lease-expiry")
        log.info("KV transfer on %s:%d", self.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        if self._server is not None:
            await self._server.stop(grace=1)
        self.service.held.release_all()

    async def _expire_leases(self) -> None:
        held = self.service.held
        interval = min(1.0, held.lease_seconds / 4)
        while True:
            await asyncio.sleep(interval)
            if held.expire():
                log.warning("freed KV blocks whose lease lapsed (no decode worker pulled them)")
