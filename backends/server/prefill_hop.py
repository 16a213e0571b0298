"""llm-d's flow: a decode worker asked to use a prefiller runs the prefill hop itself.

Behind a data plane that names one destination (Envoy with a GIE endpoint picker), the picker
chooses the decode worker and names the prefill worker in ``x-prefiller-host-port`` (or its
newer spelling ``x-llm-d-prefiller-host-port``). The decode worker sends the prefill request
as vLLM's proxy would (``max_tokens: 1``, no stream, ``do_remote_decode``), then serves the
original request with the returned ``kv_transfer_params`` (``remote_host`` replaced by the host
it dialled). If every prefiller named fails, the prompt is prefilled here: slower, not failed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import aiohttp

from backends.engine.kv_transfer_params import KVTransferParams, KVTransferParamsError
from kvgate.wire.disaggregation import decode_params, prefill_body
from kvgate.wire.routing_headers import PREFILLER_HEADERS

log = logging.getLogger(__name__)


def prefillers(headers: Mapping[str, str]) -> list[str]:
    """The ``host:port`` prefillers a request names (comma-separated: tried in order)."""
    for name in PREFILLER_HEADERS:
        value = headers.get(name)
        if value:
            return [part.strip() for part in value.split(",") if part.strip()]
    return []


async def run_prefill_hop(
    session: aiohttp.ClientSession,
    targets: list[str],
    path: str,
    body: Mapping[str, object],
    request_id: str,
    seconds: float,
) -> tuple[KVTransferParams | None, str]:
    """The params of the first prefiller that answers, and how it went (``ok``, or why
    none did: ``error``, ``timeout``, ``no_params``)."""
    payload = prefill_body(body)
    outcome = "error"
    for target in targets:
        try:
            async with session.post(
                f"http://{target}{path}",
                json=payload,
                headers={"x-request-id": request_id},
                timeout=aiohttp.ClientTimeout(total=seconds),
            ) as response:
                if response.status != 200:
                    log.warning("prefill hop to %s answered %d", target, response.status)
                    continue
                reply = await response.json()
        except TimeoutError:
            log.warning("prefill hop to %s timed out", target)
            outcome = "timeout"
            continue
        except (aiohttp.ClientError, ValueError) as exc:
            log.warning("prefill hop to %s failed: %s", target, exc)
            continue
        raw = decode_params(reply, target)
        try:
            params = KVTransferParams.parse(raw) if raw is not None else None
        except KVTransferParamsError:
            params = None
        if params is None:
            log.warning("prefill hop to %s returned no kv_transfer_params", target)
            outcome = "no_params"
            continue
        return params, "ok"
    return None, outcome
