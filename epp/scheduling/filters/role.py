"""``decode-filter`` / ``prefill-filter``: keep endpoints whose role serves that phase
(``both`` serves either)."""

from __future__ import annotations

from collections.abc import Mapping

from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.params import NoParams, parse_params


class RoleFilter:
    """Keeps endpoints whose role serves one phase: ``decode`` or ``prefill`` (``both`` serves
    either)."""

    def __init__(self, name: str, role: str) -> None:
        self.name = name
        self.role = role

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> NoParams:
        return parse_params(NoParams, name, raw)

    @classmethod
    def decode(cls, name: str, raw: Mapping[str, object]) -> RoleFilter:
        cls.parse_config(name, raw)
        return cls(name, "decode")

    @classmethod
    def prefill(cls, name: str, raw: Mapping[str, object]) -> RoleFilter:
        cls.parse_config(name, raw)
        return cls(name, "prefill")

    def filter(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        return [e for e in endpoints if e.spec.role in (self.role, "both")]
