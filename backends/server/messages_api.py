"""Anthropic's Messages API on the bundled backend: ``POST /v1/messages``, whole or streamed
as its named events (``message_start``, ``content_block_start``, ``ping``,
``content_block_delta``, ``content_block_stop``, ``message_delta``, ``message_stop``), with
Anthropic's error bodies.

A request's ``system`` and ``messages`` are generated from as the chat messages they render to
(``kvgate.wire.messages_api``); text only: a tool or image block is refused. Usage is reported
as Anthropic counts it: ``input_tokens`` leaves out the prompt tokens read from the prefix
cache, which ``cache_read_input_tokens`` counts. A stop string ends the message as
``end_turn`` (the engine does not say which string matched).
"""

from __future__ import annotations

import contextlib
import json
import uuid

from aiohttp import web

from backends.engine.engine import RequestStream
from backends.server.openai_api import EngineAborted, SSEResponse, choice_events, parse_generation
from backends.server.protocol import GenerationRequest, RequestError
from backends.server.request_body import BodyError, read_object
from backends.server.state import STATE, ServerState
from kvgate.wire.messages_api import MESSAGES_PATH, ContentError, chat_messages, error_body
from kvgate.wire.messages_api import error_event as stream_error_event

# request fields passed on to the chat request the message is generated as
PASSED = ("model", "temperature", "top_p", "top_k", "max_tokens", "stream")
STOP_REASONS = {"length": "max_tokens"}  # any other finish ends the turn


def _error(status: int, message: str) -> web.Response:
    return web.json_response(error_body(status, message), status=status)


async def create(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    try:
        body = await read_object(request)
    except BodyError as exc:
        return _error(exc.status, exc.message)
    if "max_tokens" not in body:
        return _error(400, "max_tokens: Field required")
    try:
        chat = {key: body[key] for key in PASSED if key in body}
        chat["messages"] = chat_messages(body, strict=True)
        stop = body.get("stop_sequences")
        if stop is not None:
            chat["stop"] = stop
        req, lora = parse_generation(state, chat, is_chat=True)
    except ContentError as exc:
        return _error(400, str(exc))
    except RequestError as exc:
        return _error(exc.status, exc.message)
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    try:
        stream = state.engine.add_request(
            req.prompts[0], req.sampling, lora_name=lora, request_id=request_id
        )
    except ValueError as exc:
        return _error(400, str(exc))
    message = _Message(req.model)
    try:
        if req.stream:
            return await _stream(request, state, req, stream, message)
        text, reason = "", None
        try:
            async for _, delta, finish, _ in choice_events(state, req, 0, stream):
                text, reason = text + delta, finish or reason
        except EngineAborted as exc:
            return _error(500, str(exc))
        return web.json_response(message.whole(text, reason, stream))
    finally:
        state.engine.abort(stream)


class _Message:
    """One message being made: its id and model."""

    def __init__(self, model: str) -> None:
        self.id = f"msg_{uuid.uuid4().hex}"
        self.model = model

    def head(self, content: list[object], usage: dict[str, int]) -> dict[str, object]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }

    def whole(self, text: str, reason: str | None, stream: RequestStream) -> dict[str, object]:
        content: list[object] = [{"type": "text", "text": text}] if text else []
        return {**self.head(content, _usage(stream)), "stop_reason": _stop_reason(reason)}


def _usage(stream: RequestStream, output: bool = True) -> dict[str, int]:
    seq = stream.seq
    cached = seq.num_cached_tokens
    return {
        "input_tokens": seq.num_prompt_tokens - cached,
        "cache_read_input_tokens": cached,
        "output_tokens": seq.num_output_tokens if output else 0,
    }


def _stop_reason(reason: str | None) -> str:
    return STOP_REASONS.get(reason or "stop", "end_turn")


def _event(kind: str, **fields: object) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


async def _stream(
    request: web.Request,
    state: ServerState,
    req: GenerationRequest,
    stream: RequestStream,
    message: _Message,
) -> web.StreamResponse:
    response = SSEResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    started = False
    reason = None
    try:
        async for _, delta, finish, _ in choice_events(state, req, 0, stream):
            reason = finish or reason
            if not started:  # after the first step: the prompt's cached share is known
                started = True
                await response.write(
                    _event("message_start", message=message.head([], _usage(stream, False)))
                    + _event(
                        "content_block_start", index=0, content_block={"type": "text", "text": ""}
                    )
                    + _event("ping")
                )
            if delta:
                text_delta = {"type": "text_delta", "text": delta}
                await response.write(_event("content_block_delta", index=0, delta=text_delta))
    except EngineAborted as exc:
        await response.write_eof(stream_error_event(str(exc)).encode())
        return response
    except ConnectionResetError:
        return response
    stop = {"stop_reason": _stop_reason(reason), "stop_sequence": None}
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof(
            _event("content_block_stop", index=0)
            + _event("message_delta", delta=stop, usage=_usage(stream))
            + _event("message_stop")
        )
    return response


def add_routes(app: web.Application) -> None:
    app.router.add_post(MESSAGES_PATH, create)
