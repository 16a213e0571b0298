"""Admin callers and the audit log's fallback: a key's role ranks, a wrong or empty token is
no caller, and an audit line the file cannot take goes to the gateway's log."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from gateway.admin_access import AuditLog, Caller, caller_of
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
