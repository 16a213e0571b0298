"""The text a request is routed on: the prompt, or every chat message rendered the same way."""

from __future__ import annotations

import json
from collections.abc import Mapping


def routing_text(body: Mapping[str, object]) -> str:
    messages = body.get("messages")
    if isinstance(messages, list):
        return json.dumps(messages, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return json.dumps(prompt, separators=(",", ":"))
    value = body.get("input")
    return json.dumps(value, separators=(",", ":")) if value is not None else ""
