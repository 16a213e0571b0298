"""The body sent upstream: the client's own bytes unless the pool's model name, the usage the
gateway needs from a stream, a prefill hop's KV-transfer parameters, a retention hint or a
resumable stream's token ids change it.

Fields that steer an engine's KV (``kv_transfer_params``, ``kv_hints``) are the gateway's to
set: a client's own are dropped (they could have a worker pull KV from wherever they name, or
pin blocks in another tenant's name)."""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from policies.schema import Pool

KV_TRANSFER = "kv_transfer_params"
KV_HINTS = "kv_hints"
ENGINE_FIELDS = (KV_TRANSFER, KV_HINTS)
MAX_OWNER = 64  # characters of the tenant name a hint carries
ON = ("tool_calls", "tool_use")  # an answer that calls a tool: OpenAI's and Anthropic's reasons


def retention_hint(pool: Pool, body: Mapping[str, object], owner: str) -> dict[str, object] | None:
    """vLLM's ``kv_hints`` envelope with a ``kv.retain`` action, for a request to ``pool``
    (whose ``kv_retention`` is set) that offers ``tools``: if its answer is a tool call, the
    engine keeps its blocks until the agent is back with the result (``owner``'s bound)."""
    if not pool.kv_retention or not body.get("tools"):
        return None
    action = {
        "action_id": "retain",
        "action_type": "kv.retain",
        "action_version": "1.0",
        "payload": {"ttl_s": pool.kv_retention, "owner": owner[:MAX_OWNER], "on": list(ON)},
    }
    return {"protocol_version": "1", "message_id": "kvgate", "actions": [action]}


def with_prompt_ids(body: dict[str, object], ids: list[int] | None) -> dict[str, object] | None:
    """``body``, a completion, with its text prompt replaced by ``ids`` (the engines' own
    tokens of it), so the engine tokenizes nothing; None where it has no single text prompt,
    asks for the prompt echoed (as text), or no ids are known."""
    if not ids or not isinstance(body.get("prompt"), str) or body.get("echo"):
        return None
    return {**body, "prompt": ids}


def has_engine_fields(body: Mapping[str, object]) -> bool:
    return KV_TRANSFER in body or KV_HINTS in body


def pool_body(body: dict[str, object], pool: Pool, model: str) -> dict[str, object]:
    """The client's body as ``pool``'s engines take it: its model, no client KV-transfer
    parameters."""
    if pool.model and pool.model != model:
        body = {**body, "model": pool.model}
    if has_engine_fields(body):
        body = {k: v for k, v in body.items() if k not in ENGINE_FIELDS}
    return body


def payload_for(
    body: Mapping[str, object],
    pool: Pool,
    model: str,
    *,
    raw: bytes | None = None,
    usage: bool = False,
    counts: bool = False,
    kv_transfer_params: dict[str, object] | None = None,
    token_ids: bool = False,
    kv_hints: dict[str, object] | None = None,
) -> bytes:
    """The body for ``pool``: ``raw`` (the client's bytes; None when ``body`` was changed)
    unless the pool's model differs, or a stream needs ``stream_options`` the client did not
    ask for (``usage``: its ``include_usage``; ``counts``: vLLM's ``continuous_usage_stats``,
    each chunk's count of tokens so far, for a stream the gateway may continue from its text),
    or ``kv_transfer_params`` are the gateway's (a decode hop carries its prefill's; a
    client's own are dropped: they would have a worker pull KV from wherever they name);
    ``token_ids``: ask for vLLM's ``return_token_ids`` (a stream the gateway may resume);
    ``kv_hints``: the gateway's retention hint (a client's own are dropped)."""
    changes: dict[str, object] = {}
    if token_ids:
        changes["return_token_ids"] = True
    if pool.model and pool.model != model:
        changes["model"] = pool.model
    if usage or counts:
        options = body.get("stream_options")
        changes["stream_options"] = {
            **(options if isinstance(options, dict) else {}),
            **({"include_usage": True} if usage else {}),
            **({"continuous_usage_stats": True} if counts else {}),
        }
    if kv_transfer_params is not None:
        changes[KV_TRANSFER] = kv_transfer_params
    if kv_hints is not None:
        changes[KV_HINTS] = kv_hints
    dropped = [name for name in ENGINE_FIELDS if name in body and name not in changes]
    if dropped:
        return orjson.dumps({k: v for k, v in {**body, **changes}.items() if k not in dropped})
    if not changes and raw is not None:
        return raw
    return orjson.dumps({**body, **changes})
