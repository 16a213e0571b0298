"""``KVChunk`` on the wire without protobuf's copies of its payload.

The bytes are exactly the protobuf encoding of ``kvgate.kv_transfer.v1.KVChunk``
(``proto/kvgate/api/kv_transfer.proto``; any gRPC client can read them with the generated
class), but the KV payload, field 5, is appended to the small header once instead of being
copied into a message, serialized and copied out again, and a reader gets it as a view into
the received message (docs/benchmarks.md, "Prefill/decode").
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.api import kv_transfer_pb2 as pb

DATA_TAG = b"\x2a"  # field 5, wire type 2 (length-delimited)


@dataclass(frozen=True, slots=True)
class Chunk:
    first: int
    num_blocks: int
    dtype: str
    shape: tuple[int, ...]
    data: memoryview
    num_bytes: int


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_chunk(
    first: int,
    num_blocks: int,
    dtype: str,
    shape: tuple[int, ...],
    data: bytes | memoryview,
    num_bytes: int,
) -> bytes:
    """The ``KVChunk`` message's encoding (``data`` is copied once, into it)."""
    header = pb.KVChunk(
        first=first, num_blocks=num_blocks, dtype=dtype, shape=list(shape), num_bytes=num_bytes
    ).SerializeToString()
    if not data:
        return header
    return b"".join((header, DATA_TAG, _varint(len(data)), data))


def decode_chunk(raw: bytes) -> Chunk:
    """A ``KVChunk`` message's fields; ``data`` is a view into ``raw``. Raises ``ValueError``
    on a malformed message."""
    view = memoryview(raw)
    data = memoryview(b"")
    start = 0
    end = len(raw)
    header = bytearray()
    while start < end:
        key, position = _read_varint(raw, start)
        if key == 0x2A:
            length, position = _read_varint(raw, position)
            if position + length > end:
                raise ValueError("KVChunk data runs past the message")
            data = view[position : position + length]
            start = position + length
            continue
        field_end = _skip(raw, key, position)
        header += raw[start:field_end]
        start = field_end
    message = pb.KVChunk.FromString(bytes(header))
    return Chunk(
        message.first,
        message.num_blocks,
        message.dtype,
        tuple(message.shape),
        data,
        message.num_bytes,
    )


def _read_varint(raw: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(raw) or shift > 63:
            raise ValueError("truncated varint in KVChunk")
        byte = raw[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7


def _skip(raw: bytes, key: int, position: int) -> int:
    """The end of the field whose value starts at ``position``."""
    wire_type = key & 7
    if wire_type == 0:
        return _read_varint(raw, position)[1]
    if wire_type == 2:
        length, position = _read_varint(raw, position)
        return position + length
    if wire_type == 1:
        return position + 8
    if wire_type == 5:
        return position + 4
    raise ValueError(f"unexpected wire type {wire_type} in KVChunk")
