"""vLLM's ``kv_transfer_params``: what a router, a prefill worker and a decode worker tell each
other about a request whose KV moves between them (its NixlConnector's fields).

The prefill request carries ``do_remote_decode: true`` (keep the prompt's blocks for a decode
worker); the prefill response carries ``do_remote_prefill: true`` with where the blocks are
(``remote_engine_id``, ``remote_host``, ``remote_port``, ``remote_block_ids``,
``remote_request_id``); the decode request carries those back, and pulls the blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


class KVTransferParamsError(ValueError):
    """``kv_transfer_params`` is malformed; ``field`` names the offending key."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class KVTransferParams:
    do_remote_decode: bool = False  # prefill here; a decode worker will pull the blocks
    do_remote_prefill: bool = False  # the prompt's KV is on the remote worker named below
    remote_engine_id: str | None = None
    remote_block_ids: tuple[int, ...] = field(default=())
    remote_host: str | None = None
    remote_port: int | None = None
    remote_request_id: str | None = None
    tp_size: int = 1

    @classmethod
    def parse(cls, raw: object) -> KVTransferParams:
        """The params of a request body's ``kv_transfer_params`` (null fields are absent)."""
        if not isinstance(raw, Mapping):
            raise KVTransferParamsError("kv_transfer_params must be an object", "")
        decode = _flag(raw, "do_remote_decode")
        prefill = _flag(raw, "do_remote_prefill")
        if decode and prefill:
            raise KVTransferParamsError(
                "do_remote_decode and do_remote_prefill cannot both be true", "do_remote_prefill"
            )
        params = cls(
            do_remote_decode=decode,
            do_remote_prefill=prefill,
            remote_engine_id=_text(raw, "remote_engine_id"),
            remote_block_ids=_block_ids(raw),
            remote_host=_text(raw, "remote_host"),
            remote_port=_port(raw),
            remote_request_id=_text(raw, "remote_request_id"),
            tp_size=_int(raw, "tp_size", 1),
        )
        if prefill:
            for name in ("remote_host", "remote_port", "remote_request_id"):
                if getattr(params, name) is None:
                    raise KVTransferParamsError(f"do_remote_prefill needs {name}", name)
        return params

    def to_json(self) -> dict[str, object]:
        """The dict a response (or the next hop's request) carries."""
        return {
            "do_remote_decode": self.do_remote_decode,
            "do_remote_prefill": self.do_remote_prefill,
            "remote_engine_id": self.remote_engine_id,
            "remote_block_ids": list(self.remote_block_ids),
            "remote_host": self.remote_host,
            "remote_port": self.remote_port,
            "remote_request_id": self.remote_request_id,
            "tp_size": self.tp_size,
        }


def _flag(raw: Mapping[object, object], key: str) -> bool:
    value = raw.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise KVTransferParamsError(f"{key} must be a boolean", key)
    return value


def _text(raw: Mapping[object, object], key: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise KVTransferParamsError(f"{key} must be a string", key)
    return value


def _int(raw: Mapping[object, object], key: str, default: int) -> int:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KVTransferParamsError(f"{key} must be a non-negative integer", key)
    return value


def _port(raw: Mapping[object, object]) -> int | None:
    if raw.get("remote_port") is None:
        return None
    port = _int(raw, "remote_port", 0)
    if not 0 < port < 65536:
        raise KVTransferParamsError("remote_port must be in 1..65535", "remote_port")
    return port


def _block_ids(raw: Mapping[object, object]) -> tuple[int, ...]:
    value = raw.get("remote_block_ids")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in value
    ):
        raise KVTransferParamsError(
            "remote_block_ids must be a list of non-negative integers", "remote_block_ids"
        )
    return tuple(value)
