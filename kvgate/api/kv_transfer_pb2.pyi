from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class PullRequest(_message.Message):
    __slots__ = ("remote_request_id", "remote_engine_id", "block_indexes", "dtype")
    REMOTE_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDEXES_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    remote_request_id: str
    remote_engine_id: str
    block_indexes: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    def __init__(self, remote_request_id: _Optional[str] = ..., remote_engine_id: _Optional[str] = ..., block_indexes: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ...) -> None: ...

class KVChunk(_message.Message):
    __slots__ = ("first", "num_blocks", "dtype", "shape", "data", "num_bytes")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    first: int
    num_blocks: int
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    num_bytes: int
    def __init__(self, first: _Optional[int] = ..., num_blocks: _Optional[int] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., num_bytes: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("remote_engine_id", "remote_request_ids")
    REMOTE_ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    remote_engine_id: str
    remote_request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, remote_engine_id: _Optional[str] = ..., remote_request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("unknown_request_ids",)
    UNKNOWN_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    unknown_request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, unknown_request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("remote_engine_id", "remote_request_id")
    REMOTE_ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    REMOTE_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    remote_engine_id: str
    remote_request_id: str
    def __init__(self, remote_engine_id: _Optional[str] = ..., remote_request_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...
