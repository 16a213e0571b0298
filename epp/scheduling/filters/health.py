"""``health-filter``: drop endpoints whose metrics endpoint stopped answering (3 failed scrapes
in a row), unless no healthy endpoint is left. ``model-filter``: drop endpoints that declare
(label ``models``: a comma-separated list) the models and adapters they serve, when the
request's model or adapter is not among them; endpoints without the label serve anything."""

from __future__ import annotations

from epp.framework import Endpoint, SchedulingRequest
from epp.scheduling.params import Parameterless


class HealthFilter(Parameterless):
    """Keeps endpoints whose /metrics still answer (all of them when none does)."""

    def filter(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        return [e for e in endpoints if e.healthy] or endpoints


class ModelFilter(Parameterless):
    """Keeps endpoints that serve the request's model or adapter (per their ``models`` label)."""

    def filter(self, request: SchedulingRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        wanted = request.lora or request.model
        return [e for e in endpoints if _serves(e, wanted)]


def _serves(endpoint: Endpoint, model: str) -> bool:
    declared = endpoint.spec.labels.get("models")
    return declared is None or model in {m.strip() for m in declared.split(",")}
