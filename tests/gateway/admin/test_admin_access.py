"""Admin callers and the audit log's fallback: a key's role ranks, a wrong or empty token is
no caller, and an audit line the file cannot take goes to the gateway's log."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from gateway.admin.access import (
    UNAUTHENTICATED,
    UNAUTHENTICATED_PER_MINUTE,
    AuditLog,
    Caller,
    caller_of,
)
from policies.admin_section import Admin, AdminKey

ADMIN = Admin(token="a" * 16, keys=(AdminKey("ops", "o" * 16, "operator"),))


def test_a_key_is_its_caller_and_roles_rank() -> None:
    ops = caller_of(ADMIN, "Bearer " + "o" * 16)
    assert ops == Caller("ops", "operator")
    assert ops.may("viewer") and ops.may("operator") and not ops.may("admin")
    assert caller_of(ADMIN, "Bearer " + "a" * 16) == Caller("admin", "admin")
    assert caller_of(ADMIN, "Bearer wrong") is None
    assert caller_of(Admin(token=""), "Bearer ") is None  # no key is the empty token


async def test_an_unwritable_audit_log_falls_back_to_the_gateway_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    actions = Counter("actions", "", ["action", "result"], registry=CollectorRegistry())
    audit = AuditLog(str(tmp_path / "missing" / "audit.jsonl"), actions)
    with caplog.at_level(logging.ERROR, logger="kvgate.audit"):
        await audit.record(Caller("ops", "operator"), "reload", "denied", request_id="r1")
    assert actions.labels("reload", "denied")._value.get() == 1
    line = caplog.records[0].getMessage().rsplit(": ", 1)[1]  # compact JSON: no ": "
    assert json.loads(line)["who"] == "ops"


async def test_calls_nobody_authenticated_are_counted_all_but_logged_boundedly(
    tmp_path: Path,
) -> None:
    actions = Counter("actions", "", ["action", "result"], registry=CollectorRegistry())
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(str(path), actions)
    for _ in range(UNAUTHENTICATED_PER_MINUTE + 5):
        await audit.record(None, "reload", UNAUTHENTICATED)
    await audit.record(Caller("ops", "operator"), "reload", "denied")  # others always logged
    assert actions.labels("reload", UNAUTHENTICATED)._value.get() == UNAUTHENTICATED_PER_MINUTE + 5
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == UNAUTHENTICATED_PER_MINUTE + 1 and lines[-1]["who"] == "ops"
    audit._minute -= 1  # the next minute
    await audit.record(None, "reload", UNAUTHENTICATED)
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["unauthenticated_left_out"] == 5


def test_a_role_from_a_tenants_issuer_or_without_the_admin_audience_is_no_caller() -> None:
    from policies.schema import JwtIssuer

    class Verifier:
        def __init__(self, issuer: str, claims: dict[str, object]) -> None:
            self.issuer, self.claims = issuer, claims

        def verified_claims(self, token: str) -> tuple[dict[str, object], JwtIssuer]:
            return self.claims, JwtIssuer(self.issuer, "", ("RS256",))

    admin = Admin(
        token="a" * 16,
        role_claim="role",
        role_issuers=("https://staff",),
        role_audience="admin-api",
    )
    claims: dict[str, object] = {"sub": "x", "role": "admin", "aud": ["gw", "admin-api"]}
    jwt = "Bearer h.p.s"
    staff = Verifier("https://staff", claims)
    assert caller_of(admin, jwt, staff) == Caller("jwt:x", "admin")  # type: ignore[arg-type]
    tenant = Verifier("https://tenants", claims)
    assert caller_of(admin, jwt, tenant) is None  # type: ignore[arg-type]
    no_audience = Verifier("https://staff", {**claims, "aud": "gw"})
    assert caller_of(admin, jwt, no_audience) is None  # type: ignore[arg-type]
