"""The hand-encoded KVChunk is protobuf's own encoding, both ways."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.pd.chunk_codec import decode_chunk, encode_chunk
from kvgate.api import kv_transfer_pb2 as pb


@given(
    first=st.integers(0, 2**32 - 1),
    num_blocks=st.integers(0, 2**32 - 1),
    dtype=st.text(max_size=20),
    shape=st.lists(st.integers(0, 2**32 - 1), max_size=6),
    data=st.binary(max_size=3000),
    num_bytes=st.integers(0, 2**64 - 1),
)
def test_encoded_chunks_parse_with_the_generated_class_and_back(
    first: int, num_blocks: int, dtype: str, shape: list[int], data: bytes, num_bytes: int
) -> None:
    raw = encode_chunk(first, num_blocks, dtype, tuple(shape), memoryview(data), num_bytes)
    message = pb.KVChunk.FromString(raw)
    assert (message.first, message.num_blocks, message.dtype, list(message.shape)) == (
        first, num_blocks, dtype, shape,
    )  # fmt: skip
    assert message.data == data and message.num_bytes == num_bytes
    reference = pb.KVChunk(
        first=first, num_blocks=num_blocks, dtype=dtype, shape=shape, data=data, num_bytes=num_bytes
    ).SerializeToString()
    chunk = decode_chunk(reference)
    assert (chunk.first, chunk.num_blocks, chunk.dtype, chunk.shape) == (
        first,
        num_blocks,
        dtype,
        tuple(shape),
    )
    assert bytes(chunk.data) == data and chunk.num_bytes == num_bytes


def test_the_payload_is_a_view_into_the_received_message() -> None:
    raw = encode_chunk(1, 2, "float32", (2, 2, 16), b"x" * 1000, 1000)
    chunk = decode_chunk(raw)
    assert chunk.data.obj is raw and len(chunk.data) == 1000


@pytest.mark.parametrize(
    "raw",
    [b"\x2a\x10abc", b"\x08\xff\xff", b"\x0b", bytes([0x2A]) + b"\xff" * 11],
    ids=["data past the end", "truncated varint", "group wire type", "endless varint"],
)
def test_a_malformed_chunk_is_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        decode_chunk(raw)
