"""Which conversation a request belongs to, for session affinity.

In order: the ``x-session-id`` header a client or agent framework sets; the OpenAI ``user``
field; else, for chat requests, a hash of the first turn (every message up to and including
the first user message), which every later turn of the same conversation resends unchanged.
A request with none of these (a plain completion without ``user``) has no session.
"""

from __future__ import annotations

from collections.abc import Mapping

import xxhash

from kvgate.wire.json_text import compact_json

SESSION_HEADER = "x-session-id"


def session_key(body: Mapping[str, object], headers: Mapping[str, str]) -> str | None:
    """The request's session, prefixed by where it came from (``id:``, ``user:``, ``turn:``)
    so a user name can never collide with a hash."""
    explicit = headers.get(SESSION_HEADER)
    if explicit:
        return "id:" + explicit
    user = body.get("user")
    if isinstance(user, str) and user:
        return "user:" + user
    messages = body.get("messages")
    if isinstance(messages, list):
        first = _first_turn(messages)
        if first:
            return "turn:" + xxhash.xxh3_64_hexdigest(compact_json(first).encode())
    return None


def _first_turn(messages: list[object]) -> list[object]:
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return messages[: i + 1]
    return []
