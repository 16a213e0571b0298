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
    raw: bytes,
    body: Mapping[str, object],
    pool: Pool,
    model: str,
    add_usage: bool,
    kv_transfer_params: dict[str, object] | None = None,
    token_ids: bool = False,
) -> bytes:
    """The body for ``pool``: the original bytes unless the pool's model differs, on a
    stream the client asked no usage of ``stream_options.include_usage`` must be added, or
    ``kv_transfer_params`` are the gateway's (a decode hop carries its prefill's; a client's
    own are dropped: they would have a worker pull KV from wherever they name); ``token_ids``:
    ask for vLLM's ``return_token_ids`` (a stream the gateway may have to resume)."""
    changes: dict[str, object] = {}
    if token_ids:
        changes["return_token_ids"] = True
    if pool.model and pool.model != model:
        changes["model"] = pool.model
    if add_usage:
        options = body.get("stream_options")
        changes["stream_options"] = {
            **(options if isinstance(options, dict) else {}),
            "include_usage": True,
        }
    if kv_transfer_params is not None:
        changes[KV_TRANSFER] = kv_transfer_params
    elif KV_TRANSFER in body:
        return orjson.dumps({k: v for k, v in {**body, **changes}.items() if k != KV_TRANSFER})
    if not changes:
        return raw
    return orjson.dumps({**body, **changes})
