"""``kv_hints``: KV hints a router attaches to a request, in vLLM's envelope
(``KvHintsEnvelope``: ``protocol_version``, ``message_id``, ``actions``, each action an
``action_id``, ``action_type``, ``action_version`` and a ``payload`` its component defines).

This engine implements one action, ``kv.retain`` (version ``1.0``): when the request finishes
for one of the reasons in ``on`` (default ``["tool_calls"]``: the caller will be back with the
tool's result), keep its blocks cached for ``ttl_s`` seconds, counted against ``owner``'s
bound (``backends.engine.retention``); when it finishes for another reason (the session's final
answer), end the pins its blocks still hold. Actions of other types are ignored, as a component
ignores actions it does not implement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from backends.server.protocol import RequestError

RETAIN = "kv.retain"
FIELD = "kv_hints"


@dataclass(frozen=True, slots=True)
class RetainHint:
    """Keep the request's blocks for ``ttl`` seconds if it finishes for a reason in ``on``."""

    ttl: float
    owner: str
    on: tuple[str, ...] = ("tool_calls",)


def retain_hint(body: Mapping[str, object]) -> RetainHint | None:
    """The request's ``kv.retain`` hint; ``RequestError`` for a malformed envelope or one."""
    envelope = body.get(FIELD)
    if envelope is None:
        return None
    actions = envelope.get("actions") if isinstance(envelope, Mapping) else None
    if not isinstance(actions, list) or not all(isinstance(a, Mapping) for a in actions):
        raise RequestError(f"{FIELD} must be an object with a list of actions", FIELD)
    for action in actions:
        if action.get("action_type") == RETAIN:
            return _retain(action.get("payload"))
    return None


def _retain(payload: object) -> RetainHint:
    name = f"{FIELD}.actions.payload"
    if not isinstance(payload, Mapping):
        raise RequestError(f"{RETAIN} needs a payload object", name)
    ttl, owner, on = payload.get("ttl_s"), payload.get("owner", ""), payload.get("on")
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0:
        raise RequestError(f"{RETAIN}: ttl_s must be a positive number of seconds", name)
    if not isinstance(owner, str):
        raise RequestError(f"{RETAIN}: owner must be a string", name)
    if on is None:
        return RetainHint(float(ttl), owner)
    if not isinstance(on, list) or not all(isinstance(r, str) for r in on):
        raise RequestError(f"{RETAIN}: on must be a list of finish reasons", name)
    return RetainHint(float(ttl), owner, tuple(on))
