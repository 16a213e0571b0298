from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PickRequest(_message.Message):
    __slots__ = ("request_id", "model", "routing_text", "token_ids", "headers", "subset", "exclude")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROUTING_TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    SUBSET_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    routing_text: str
    token_ids: TokenIds
    headers: _containers.ScalarMap[str, str]
    subset: _containers.RepeatedScalarFieldContainer[str]
    exclude: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., routing_text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., headers: _Optional[_Mapping[str, str]] = ..., subset: _Optional[_Iterable[str]] = ..., exclude: _Optional[_Iterable[str]] = ...) -> None: ...

class EndpointScore(_message.Message):
    __slots__ = ("address", "score", "role")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    address: str
    score: float
    role: str
    def __init__(self, address: _Optional[str] = ..., score: _Optional[float] = ..., role: _Optional[str] = ...) -> None: ...

class PdPair(_message.Message):
    __slots__ = ("prefill", "decode")
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    prefill: str
    decode: str
    def __init__(self, prefill: _Optional[str] = ..., decode: _Optional[str] = ...) -> None: ...

class PickResponse(_message.Message):
    __slots__ = ("endpoints", "target_model", "decided_by", "pd", "request_id")
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODEL_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    PD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedCompositeFieldContainer[EndpointScore]
    target_model: str
    decided_by: str
    pd: PdPair
    request_id: str
    def __init__(self, endpoints: _Optional[_Iterable[_Union[EndpointScore, _Mapping]]] = ..., target_model: _Optional[str] = ..., decided_by: _Optional[str] = ..., pd: _Optional[_Union[PdPair, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class FinishedRequest(_message.Message):
    __slots__ = ("request_id", "prompt_tokens", "refused")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_tokens: int
    refused: bool
    def __init__(self, request_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., refused: _Optional[bool] = ...) -> None: ...

class FinishedResponse(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...
