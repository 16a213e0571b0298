"""Who is calling: the result of authentication, used by routing, limits and logs."""

from __future__ import annotations

from dataclasses import dataclass

from policies.schema import DEFAULT_CLASS, Policy


@dataclass(frozen=True, slots=True)
class Identity:
    tenant: str
    priority_class: str = DEFAULT_CLASS
    models: frozenset[str] | None = None  # public models allowed; None: every routed model
    principal: str = ""  # key name or JWT subject: safe to log, never a secret
    method: str = "anonymous"  # api_key | jwt | anonymous

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


def resolve_identity(
    policy: Policy,
    tenant: str,
    priority_class: str | None,
    models: tuple[str, ...] | None,
    principal: str,
    method: str,
) -> Identity:
    """Fill class and models from the tenant's defaults where the credential leaves them open."""
    declared = policy.tenants.get(tenant)
    if priority_class is None and declared is not None:
        priority_class = declared.priority_class
    if models is None and declared is not None:
        models = declared.models
    return Identity(
        tenant=tenant,
        priority_class=priority_class or DEFAULT_CLASS,
        models=frozenset(models) if models is not None else None,
        principal=principal,
        method=method,
    )
