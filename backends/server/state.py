"""What the backend's handlers share: the engine, tokenizer, served names and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from backends.engine.engine import AsyncEngine
from backends.pd.connector import PdConnector
from backends.pd.transfer_service import TransferServer
from backends.server.metrics import ServerMetrics
from backends.server.protocol import RequestError
from backends.server.response_store import ResponseStore
from backends.server.tracing import RequestTracer
from kvgate.wire.request_tokenizer import RequestTokenizer


@dataclass
class ServerState:
    engine: AsyncEngine
    tokenizer: RequestTokenizer
    model_name: str
    metrics: ServerMetrics
    max_loras: int = 1
    completion_max_tokens: int = 16  # default max_tokens for /v1/completions (OpenAI's)
    chat_max_tokens: int = 256  # default max_tokens for /v1/chat/completions
    lora_adapters: dict[str, str] = field(default_factory=dict)  # name -> path
    created: int = 0
    vocab_size: int | None = None  # the model's (token ids above the tokenizer's are valid)
    role: str = "both"  # both | prefill | decode
    pd: PdConnector | None = None  # prefill/decode workers' KV connector
    transfer_server: TransferServer | None = None  # a prefill worker's KV transfer service
    prefill_session: aiohttp.ClientSession | None = None  # a decode worker's prefill hops
    prefill_timeout: float = 60.0
    responses: ResponseStore = field(default_factory=ResponseStore)  # /v1/responses, stored
    tracer: RequestTracer | None = None  # each request's spans (--otlp-traces-endpoint)

    def default_max_tokens(self, is_chat: bool) -> int:
        return self.chat_max_tokens if is_chat else self.completion_max_tokens

    def resolve_model(self, model: str) -> str | None:
        """The LoRA adapter a request's ``model`` names (None for the base model)."""
        if model == self.model_name:
            return None
        if model in self.lora_adapters:
            return model
        raise RequestError(f"The model `{model}` does not exist.", "model", status=404)


STATE = web.AppKey("backend_state", ServerState)
