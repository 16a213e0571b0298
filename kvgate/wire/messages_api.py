"""Anthropic's Messages API (``/v1/messages``) as every part reads it: a request's ``system``
and ``messages`` as chat messages, and its error body, whole or as a stream's ``error`` event.

A message's content is a string or a list of content blocks; its text blocks are joined into
the chat message's content. Blocks of another kind (an image, a tool call or its result) are
rendered as their JSON where the text is only routed on, so two requests differing in them do
not look alike; where the text is generated from (``strict``), they are refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from kvgate.wire.json_text import compact_json

MESSAGES_PATH = "/v1/messages"
# Anthropic's error type for each status it documents; a status not listed is an api_error
# (5xx) or an invalid_request_error (4xx)
ERROR_TYPES = {
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class ContentError(ValueError):
    """Content this module cannot read as text (the message names the field)."""


def chat_messages(body: Mapping[str, object], *, strict: bool = False) -> list[dict[str, str]]:
    """``system`` (as a system message) and ``messages`` as chat messages; with ``strict``, a
    ``ContentError`` for what is not text."""
    messages: list[dict[str, str]] = []
    system = body.get("system")
    if system is not None and system != "":
        messages.append({"role": "system", "content": _text(system, "system", strict)})
    value = body.get("messages")
    if not isinstance(value, list):
        if strict:
            raise ContentError("messages must be a list of messages")
        return messages
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            if strict:
                raise ContentError(f"{where} must be an object with a role and content")
            messages.append({"role": "user", "content": compact_json(message)})
            continue
        content = _text(message.get("content"), f"{where}.content", strict)
        messages.append({"role": str(message["role"]), "content": content})
    return messages


def _text(content: object, where: str, strict: bool) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        if strict:
            raise ContentError(f"{where} must be a string or a list of content blocks")
        return compact_json(content)
    texts: list[str] = []
    for index, block in enumerate(content):
        if isinstance(block, Mapping) and block.get("type") == "text":
            text = block.get("text")
            if isinstance(text, str):
                texts.append(text)
                continue
        if strict:
            raise ContentError(f"{where}[{index}] is not a text block; only text is supported")
        texts.append(compact_json(block))
    return "".join(texts)


def error_type_for(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str) -> dict[str, object]:
    """Anthropic's error body, ``{"type": "error", "error": {"type", "message"}}``."""
    return {"type": "error", "error": {"type": error_type_for(status), "message": message}}


def error_event(message: str, status: int = 500) -> str:
    """The error as a Messages stream ends with it (``event: error``)."""
    return f"event: error\ndata: {json.dumps(error_body(status, message))}\n\n"
