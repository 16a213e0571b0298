"""The router's side of vLLM's prefill/decode protocol, shared by the gateway (which runs both
hops) and a decode worker given llm-d's prefiller header (which runs the prefill hop itself).

The prefill hop is the client's request with ``max_tokens: 1``, no stream and
``kv_transfer_params.do_remote_decode``, as vLLM's toy proxy and llm-d's sidecar send it; its
response's ``kv_transfer_params`` go into the decode hop with ``remote_host`` replaced by the
host actually dialled.
"""

from __future__ import annotations

from collections.abc import Mapping

DROPPED_FIELDS = ("stream_options", "min_tokens", "max_completion_tokens")
PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def prefill_body(body: Mapping[str, object]) -> dict[str, object]:
    """The prefill hop's body: one token, whole, its KV kept for a decode worker."""
    payload = {k: v for k, v in body.items() if k not in DROPPED_FIELDS}
    payload["max_tokens"] = 1
    payload["stream"] = False
    payload["kv_transfer_params"] = dict(PREFILL_PARAMS)
    if "max_completion_tokens" in body:
        payload["max_completion_tokens"] = 1
    return payload


def decode_params(reply: object, dialled: str) -> dict[str, object] | None:
    """The ``kv_transfer_params`` a prefill response hands the decode hop (``remote_host``:
    the host of ``dialled``, a ``host:port``), or None if it holds no KV for one."""
    if not isinstance(reply, Mapping):
        return None
    params = reply.get("kv_transfer_params")
    if not isinstance(params, Mapping) or params.get("do_remote_prefill") is not True:
        return None
    return {**params, "remote_host": dialled.rsplit(":", 1)[0].strip("[]")}
