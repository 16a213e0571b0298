"""OpenAI's error body, ``{"error": {"message", "type", "param", "code"}}``: the one builder
for every error kvgate answers (gateway, EPP, backend), whole or as an SSE event."""

from __future__ import annotations

import json


def error_type_for(status: int) -> str:
    """OpenAI's ``type`` for an HTTP status kvgate has no more specific type for."""
    if status == 429:
        return "rate_limit_error"
    return "invalid_request_error" if status < 500 else "server_error"


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, dict[str, str | None]]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def sse_error_event(message: str, error_type: str = "server_error", code: str | None = None) -> str:
    """The error as one SSE event (``data: {...}`` and a blank line), as OpenAI ends a stream
    that failed midway."""
    return f"data: {json.dumps(error_body(message, error_type, code=code))}\n\n"


def responses_error_event(message: str, code: str) -> str:
    """The error as the Responses API streams it (``event: error``), which ends a response's
    stream as ``sse_error_event`` ends a chat completion's."""
    data = json.dumps({"type": "error", "code": code, "message": message, "param": None})
    return f"event: error\ndata: {data}\n\n"


# What either deployment (the gateway, or the picker behind Envoy) answers a bad request with:
# a client moving between them sees the same status, message, param and code.
NOT_AN_OBJECT = "the request body must be a JSON object"
MODEL_REQUIRED = "model is required and must be a string"


def invalid_json(exc: Exception) -> str:
    return f"invalid JSON body: {exc}"


def unknown_model(model: str) -> str:
    return f"The model `{model}` does not exist or you do not have access to it."


def body_too_large(limit: int) -> str:
    return f"request body exceeds {limit} bytes"


def response_not_found(response_id: str) -> str:
    return f"Response with id '{response_id}' not found."
