"""The decode worker's side of ``KVTransfer``: pull held blocks, renew leases, release them.

One channel per prefill worker address, kept open (a pull per request would otherwise pay a
connection set-up each time).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from backends.pd.chunk_codec import Chunk, decode_chunk
from backends.pd.transfer_service import GRPC_OPTIONS, SERVICE
from kvgate.api import kv_transfer_pb2 as pb
from kvgate.api import kv_transfer_pb2_grpc as pb_grpc

RPC_TIMEOUT = 5.0  # heartbeats and releases


class TransferClient:
    def __init__(self, pull_timeout: float = 30.0) -> None:
        self.pull_timeout = pull_timeout
        self._stubs: dict[str, tuple[grpc.aio.Channel, pb_grpc.KVTransferStub, Any]] = {}

    def _entry(self, address: str) -> tuple[grpc.aio.Channel, pb_grpc.KVTransferStub, Any]:
        entry = self._stubs.get(address)
        if entry is None:
            channel = grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
            pull = channel.unary_stream(
                f"/{SERVICE}/Pull",
                request_serializer=pb.PullRequest.SerializeToString,
                response_deserializer=decode_chunk,
            )
            entry = (channel, pb_grpc.KVTransferStub(channel), pull)  # type: ignore[no-untyped-call]
            self._stubs[address] = entry
        return entry

    def _stub(self, address: str) -> pb_grpc.KVTransferStub:
        return self._entry(address)[1]

    async def pull(
        self,
        address: str,
        engine_id: str,
        request_id: str,
        block_indexes: Sequence[int],
        dtype: str = "",
    ) -> AsyncIterator[Chunk]:
        """The chunks of ``block_indexes`` of a held request (raises ``grpc.aio.AioRpcError``;
        a chunk's data is a view into the received message)."""
        request = pb.PullRequest(
            remote_request_id=request_id,
            remote_engine_id=engine_id,
            block_indexes=list(block_indexes),
            dtype=dtype,
        )
        call = self._entry(address)[2](request, timeout=self.pull_timeout)
        async for chunk in call:
            yield chunk

    async def heartbeat(self, address: str, engine_id: str, request_ids: list[str]) -> list[str]:
        """Renew leases; the ids the prefill worker no longer holds."""
        request = pb.HeartbeatRequest(remote_engine_id=engine_id, remote_request_ids=request_ids)
        reply = await self._stub(address).Heartbeat(request, timeout=RPC_TIMEOUT)
        return list(reply.unknown_request_ids)

    async def release(self, address: str, engine_id: str, request_id: str) -> bool:
        request = pb.ReleaseRequest(remote_engine_id=engine_id, remote_request_id=request_id)
        reply = await self._stub(address).Release(request, timeout=RPC_TIMEOUT)
        return bool(reply.released)

    async def close(self) -> None:
        for channel, _, _ in self._stubs.values():
            with contextlib.suppress(Exception):
                await channel.close()
        self._stubs.clear()
