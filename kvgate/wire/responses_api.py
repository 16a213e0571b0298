"""OpenAI's Responses API (``/v1/responses``) as every part reads it: a request's input as chat
messages, a response's usage in chat terms, and the stream events that end a response.

A request's ``instructions`` and ``input`` (a string, or a list of message items whose content is
a string or ``input_text``/``output_text`` parts) become the chat messages a chat template
renders: the gateway and the picker route on them as on a chat request, and the bundled backend
generates from them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import orjson

RESPONSES_PATH = "/v1/responses"
STORED_PREFIX = RESPONSES_PATH + "/"
RESPONSE_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")
# the requests about one stored response: path suffix -> methods
ACTIONS = {"": ("GET", "DELETE"), "/cancel": ("POST",), "/input_items": ("GET",)}
# the stream events after which a response produces nothing more
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


def addressed_response(path: str) -> tuple[str, str] | None:
    """(response id, action: "", "/cancel" or "/input_items") of a path about one stored
    response (``/v1/responses/{id}...``, query left out); None for any other path."""
    if not path.startswith(STORED_PREFIX):
        return None
    response_id, slash, action = path[len(STORED_PREFIX) :].partition("/")
    if slash + action not in ACTIONS or not RESPONSE_ID.fullmatch(response_id):
        return None
    return response_id, slash + action


def id_in_body(data: bytes) -> str:
    """A whole response object's ``id`` ("" when there is none)."""
    try:
        parsed = orjson.loads(data)
    except ValueError:
        return ""
    value = parsed.get("id") if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else ""


class InputError(ValueError):
    """An ``input`` this module cannot read as chat messages (the message names the field)."""


def input_messages(body: Mapping[str, object], *, strict: bool = False) -> list[dict[str, str]]:
    """``instructions`` (as a system message) and ``input`` as chat messages. Items that are
    not messages (tool calls, reasoning) are skipped, or with ``strict`` an ``InputError``."""
    messages: list[dict[str, str]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    value = body.get("input")
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
        return messages
    if not isinstance(value, list):
        if strict:
            raise InputError("input must be a string or a list of input items")
        return messages
    for index, item in enumerate(value):
        message = _item_message(item)
        if message is not None:
            messages.append(message)
        elif strict:
            raise InputError(
                f"input[{index}] is not a message item with text content (role and content)"
            )
    return messages


def _item_message(item: object) -> dict[str, str] | None:
    if not isinstance(item, Mapping) or item.get("type", "message") != "message":
        return None
    role, content = item.get("role"), item.get("content")
    if not isinstance(role, str):
        return None
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        return None
    texts: list[str] = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") not in TEXT_PARTS:
            return None
        text = part.get("text")
        if not isinstance(text, str):
            return None
        texts.append(text)
    return {"role": role, "content": "".join(texts)}
