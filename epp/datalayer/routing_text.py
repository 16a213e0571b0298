"""The text a request is routed on: the prompt, or every chat message rendered the same way.

Only a prefix is ever hashed, so ``limit`` (characters) stops the rendering early: each message
is rendered with its content cut to what is still needed, which keeps the output a stable
prefix of the full rendering for requests that share their first ``limit`` characters.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvgate.wire.json_text import compact_json


def routing_text(body: Mapping[str, object], limit: int | None = None) -> str:
    messages = body.get("messages")
    if isinstance(messages, list):
        return _render_messages(messages, limit)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt if limit is None else prompt[:limit]
    value = prompt if isinstance(prompt, list) else body.get("input")
    text = compact_json(value) if value is not None else ""
    return text if limit is None else text[:limit]


def _render_messages(messages: list[object], limit: int | None) -> str:
    parts: list[str] = []
    size = 0
    for message in messages:
        if limit is not None and size >= limit:
            break
        if isinstance(message, dict):
            content = message.get("content")
            if limit is not None and isinstance(content, str) and len(content) > limit - size:
                message = {**message, "content": content[: limit - size]}
        part = compact_json(message)
        parts.append(part)
        size += len(part) + 1
    text = "\n".join(parts)
    return text if limit is None else text[:limit]
