"""The body sent upstream: the client's own bytes unless the pool's model name, the usage the
gateway needs from a stream, a prefill hop's KV-transfer parameters or a resumable stream's
token ids change it."""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from policies.schema import Pool

KV_TRANSFER = "kv_transfer_params"


def pool_body(body: dict[str, object], pool: Pool, model: str) -> dict[str, object]:
    """The client's body as ``pool``'s engines take it: its model, no client KV-transfer
    parameters."""
    if pool.model and pool.model != model:
        body = {**body, "model": pool.model}
    if KV_TRANSFER in body:
        body = {k: v for k, v in body.items() if k != KV_TRANSFER}
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
) -> bytes:
    """The body for ``pool``: ``raw`` (the client's bytes; None when ``body`` was changed)
    unless the pool's model differs, or a stream needs ``stream_options`` the client did not
    ask for (``usage``: its ``include_usage``; ``counts``: vLLM's ``continuous_usage_stats``,
    each chunk's count of tokens so far, for a stream the gateway may continue from its text),
    or ``kv_transfer_params`` are the gateway's (a decode hop carries its prefill's; a
    client's own are dropped: they would have a worker pull KV from wherever they name);
    ``token_ids``: ask for vLLM's ``return_token_ids`` (a stream the gateway may resume)."""
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
    elif KV_TRANSFER in body:
        return orjson.dumps({k: v for k, v in {**body, **changes}.items() if k != KV_TRANSFER})
    if not changes and raw is not None:
        return raw
    return orjson.dumps({**body, **changes})
