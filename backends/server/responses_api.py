"""OpenAI's Responses API on the bundled backend: ``POST /v1/responses`` (whole, or streamed as
its named events), and by id: retrieve, delete, cancel, input items.

A request's ``instructions`` and ``input`` are generated from as the chat messages they render
to (``kvgate.wire.responses_api``), after the stored conversation of ``previous_response_id``.
Text output only: tools are not called, and ``background`` is refused.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid

from aiohttp import web

from backends.engine.engine import RequestStream
from backends.server.errors import error_response
from backends.server.openai_api import (
    EngineAborted,
    SSEResponse,
    choice_events,
    parse_generation,
    request_error,
)
from backends.server.protocol import GenerationRequest, RequestError
from backends.server.request_body import BodyError, read_object
from backends.server.response_store import StoredResponse
from backends.server.state import STATE, ServerState
from kvgate.wire.openai_errors import responses_error_event
from kvgate.wire.responses_api import InputError, input_messages

# request fields passed to the chat request the response is generated as
SAMPLING = ("model", "temperature", "top_p", "seed", "top_k", "min_tokens", "ignore_eos")


def _not_found(response_id: str) -> web.Response:
    return error_response(404, f"Response with id '{response_id}' not found.", "response_id")


async def create(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    try:
        body = await read_object(request)
    except BodyError as exc:
        return error_response(exc.status, exc.message)
    if body.get("background") is True:
        return error_response(400, "background responses are not supported", "background")
    history: list[dict[str, str]] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        stored = state.responses.get(previous) if isinstance(previous, str) else None
        if stored is None:
            return _not_found(str(previous))
        history = list(stored.history)
    try:
        turn = input_messages({"input": body.get("input")}, strict=True)
    except InputError as exc:
        return error_response(400, str(exc), "input")
    instructions = input_messages({"instructions": body.get("instructions")})
    chat = {key: body[key] for key in SAMPLING if key in body}
    chat["messages"] = instructions + history + turn
    if "max_output_tokens" in body:
        chat["max_tokens"] = body["max_output_tokens"]
    try:
        req, lora = parse_generation(state, chat, is_chat=True)
    except RequestError as exc:
        if exc.param == "max_tokens":  # the Responses API's name for it
            message = exc.message.replace("max_tokens", "max_output_tokens")
            exc = RequestError(message, "max_output_tokens", status=exc.status)
        return request_error(exc)
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
    try:
        stream = state.engine.add_request(
            req.prompts[0], req.sampling, lora_name=lora, request_id=request_id
        )
    except ValueError as exc:
        return error_response(400, str(exc), "max_output_tokens")
    draft = _Draft(body, req.model, history, turn)
    try:
        if body.get("stream") is True:
            return await _stream(request, state, req, stream, draft)
        text, reason = "", None
        try:
            async for _, delta, finish, _ in choice_events(state, req, 0, stream):
                text, reason = text + delta, finish or reason
        except EngineAborted as exc:
            return error_response(500, str(exc))
        return web.json_response(draft.finish(state, stream, text, reason))
    finally:
        state.engine.abort(stream)


class _Draft:
    """One response being made: its ids and the fields known before generation."""

    def __init__(
        self,
        body: dict[str, object],
        model: str,
        history: list[dict[str, str]],
        turn: list[dict[str, str]],
    ):
        self.body = body
        self.id = f"resp_{uuid.uuid4().hex}"
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.history = history  # the continued response's conversation
        self.turn = turn  # this request's input, as chat messages
        self.response: dict[str, object] = {
            "id": self.id,
            "object": "response",
            "created_at": int(time.time()),
            "model": model,
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") or {},
            "output": [],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "store": body.get("store", True) is not False,
            "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0),
            "truncation": "disabled",
            "usage": None,
        }

    def message(self, text: str, status: str) -> dict[str, object]:
        content = [{"type": "output_text", "text": text, "annotations": []}] if text else []
        return {
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def finish(
        self, state: ServerState, stream: RequestStream, text: str, reason: str | None
    ) -> dict[str, object]:
        """The finished response object (stored when ``store`` allows)."""
        seq = stream.seq
        prompt, output = seq.num_prompt_tokens, seq.num_output_tokens
        done = reason != "length"
        response = {
            **self.response,
            "status": "completed" if done else "incomplete",
            "incomplete_details": None if done else {"reason": "max_output_tokens"},
            "output": [self.message(text, "completed" if done else "incomplete")],
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": seq.num_cached_tokens},
                "output_tokens": output,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + output,
            },
        }
        if response["store"]:
            items: list[dict[str, object]] = [
                {
                    "id": f"msg_{uuid.uuid4().hex}",
                    "type": "message",
                    "role": m["role"],
                    "content": [{"type": "input_text", "text": m["content"]}],
                }
                for m in self.turn
            ]
            history = [*self.history, *self.turn, {"role": "assistant", "content": text}]
            state.responses.put(self.id, StoredResponse(response, items, history))
        return response


async def _stream(
    request: web.Request,
    state: ServerState,
    req: GenerationRequest,
    stream: RequestStream,
    draft: _Draft,
) -> web.StreamResponse:
    response = SSEResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    number = 0

    def event(kind: str, **fields: object) -> bytes:
        nonlocal number
        data = json.dumps({"type": kind, "sequence_number": number, **fields})
        number += 1
        return f"event: {kind}\ndata: {data}\n\n".encode()

    where = {"item_id": draft.message_id, "output_index": 0, "content_index": 0}
    part: dict[str, object] = {"type": "output_text", "text": "", "annotations": []}
    await response.write(
        event("response.created", response=draft.response)
        + event("response.in_progress", response=draft.response)
        + event("response.output_item.added", output_index=0, item=draft.message("", "in_progress"))
        + event("response.content_part.added", part=part, **where)
    )
    text, reason = "", None
    try:
        async for _, delta, finish, _ in choice_events(state, req, 0, stream):
            text, reason = text + delta, finish or reason
            if delta:
                await response.write(
                    event("response.output_text.delta", delta=delta, logprobs=[], **where)
                )
    except EngineAborted as exc:
        await response.write_eof(responses_error_event(str(exc), "engine_aborted").encode())
        return response
    except ConnectionResetError:
        return response
    final = draft.finish(state, stream, text, reason)
    item = final["output"][0] if isinstance(final["output"], list) else None
    terminal = "response.completed" if final["status"] == "completed" else "response.incomplete"
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof(
            event("response.output_text.done", text=text, logprobs=[], **where)
            + event("response.content_part.done", part={**part, "text": text}, **where)
            + event("response.output_item.done", output_index=0, item=item)
            + event(terminal, response=final)
        )
    return response


async def retrieve(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    stored = request.app[STATE].responses.get(response_id)
    if stored is None:
        return _not_found(response_id)
    return web.json_response(stored.response)


async def delete(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    if not request.app[STATE].responses.delete(response_id):
        return _not_found(response_id)
    return web.json_response({"id": response_id, "object": "response", "deleted": True})


async def cancel(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    if request.app[STATE].responses.get(response_id) is None:
        return _not_found(response_id)
    return error_response(400, "Only responses created with background=true can be cancelled.")


async def input_items(request: web.Request) -> web.Response:
    """The response's input items, newest first unless ``order=asc``; ``limit`` (1-100, 20)."""
    response_id = request.match_info["response_id"]
    stored = request.app[STATE].responses.get(response_id)
    if stored is None:
        return _not_found(response_id)
    order = request.query.get("order", "desc")
    limit_text = request.query.get("limit", "20")
    if order not in ("asc", "desc") or not limit_text.isdigit() or not 1 <= int(limit_text) <= 100:
        return error_response(400, "order must be asc or desc and limit 1 to 100", "order")
    items = stored.input_items if order == "asc" else stored.input_items[::-1]
    page = items[: int(limit_text)]
    return web.json_response(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > len(page),
        }
    )


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/responses", create)
    app.router.add_get("/v1/responses/{response_id}", retrieve)
    app.router.add_delete("/v1/responses/{response_id}", delete)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel)
    app.router.add_get("/v1/responses/{response_id}/input_items", input_items)
