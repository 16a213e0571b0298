"""Which conversation or agent session a request belongs to, for session affinity.

From what clients and agents already send, the first found of:

1. Claude Code's ``x-claude-code-session-id`` header;
2. OpenAI's ``prompt_cache_key`` body field (OpenAI's own routing hint for prompt caching);
3. the ``x-session-id`` header, else a ``session_id`` body field;
4. Anthropic's ``metadata.user_id`` (the Messages API);
5. the OpenAI ``user`` field;
6. for chat requests (and Messages, read as chat), a hash of the first turn: every message up
   to and including the first user message, which every later turn resends unchanged.

A request with none of these (a plain completion without ``user``) has no session. A session
is a routing hint, never read for authorization: a value past ``MAX_VALUE`` characters is
hashed (what the scorer keeps stays bounded), and where the caller's tenant is known (the
gateway's picker) the key is the tenant's own, so one tenant's session id never steers, or
probes, another tenant's requests.
"""

from __future__ import annotations

from collections.abc import Mapping

import xxhash

from kvgate.wire.json_text import compact_json

CLAUDE_CODE_HEADER = "x-claude-code-session-id"
SESSION_HEADER = "x-session-id"
MAX_VALUE = 256  # characters of a session value kept as they are (longer ones are hashed)


def session_key(
    body: Mapping[str, object], headers: Mapping[str, str], tenant: str = ""
) -> str | None:
    """The request's session, prefixed by the kind of its source (``id:``, ``cache:``,
    ``user:``, ``turn:``: a user name never collides with a hash), and by ``tenant``."""
    key = _key(body, headers)
    if key is None or not tenant:
        return key
    return f"{tenant}\x1f{key}"


def _key(body: Mapping[str, object], headers: Mapping[str, str]) -> str | None:
    explicit = headers.get(CLAUDE_CODE_HEADER)
    if explicit:
        return "id:" + _bounded(explicit)
    cache_key = body.get("prompt_cache_key")
    if isinstance(cache_key, str) and cache_key:
        return "cache:" + _bounded(cache_key)
    explicit = headers.get(SESSION_HEADER) or _text(body.get("session_id"))
    if explicit:
        return "id:" + _bounded(explicit)
    metadata = body.get("metadata")
    user = _text(metadata.get("user_id")) if isinstance(metadata, dict) else ""
    if user or (user := _text(body.get("user"))):
        return "user:" + _bounded(user)
    messages = body.get("messages")
    if isinstance(messages, list):
        first = _first_turn(messages)
        if first:
            return "turn:" + xxhash.xxh3_64_hexdigest(compact_json(first).encode())
    return None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _bounded(value: str) -> str:
    """``value`` as it is, or its hash past ``MAX_VALUE`` characters."""
    if len(value) <= MAX_VALUE:
        return value
    return "#" + xxhash.xxh3_128_hexdigest(value.encode(errors="surrogatepass"))


def _first_turn(messages: list[object]) -> list[object]:
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return messages[: i + 1]
    return []
