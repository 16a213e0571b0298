"""The admin API's roles and its audit trail, on a real gateway process: a viewer reads, an
operator may not reload, the admin may; every attempted change, allowed or not, is one JSON
line of the audit log and one count of ``kvgate_admin_actions_total``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from gateway.admin.access import UNAUTHENTICATED_PER_MINUTE
from loadtest.harness.processes import KvgateProcess, free_port
from tests.gateway.jwt_keys import make_keys
from tests.integration.metrics_util import scrape

ADMIN, OPERATOR, VIEWER = "admin-token-0123456789", "operator-token-012345", "viewer-token-0123456"
TENANTS_IDP, STAFF_IDP = "https://idp.test", "https://staff-idp.test"


@dataclass
class AdminGateway:
    url: str  # the gateway's
    admin: str  # the admin API's base URL
    audit: Path
    text: str  # the policy it started with
    process: KvgateProcess


Start = Callable[..., AdminGateway]


@pytest.fixture
def admin_gateway(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    tmp_path: Path,
) -> Start:
    """Starts a gateway with the admin API (its policy text passed through ``edit``)."""

    def start(edit: Callable[[str], str] = lambda text: text) -> AdminGateway:
        backend = start_backend("--cost", "zero").removeprefix("http://")
        admin_port, audit = free_port(), tmp_path / "audit.jsonl"
        text = edit(policy(backend, admin_port, audit))
        url, process = start_gateway(text)
        return AdminGateway(url, f"http://127.0.0.1:{admin_port}/admin", audit, text, process)

    return start


def policy(backend: str, admin_port: int, audit: Path) -> str:
    return f"""
listen:
  admin:
    port: {admin_port}
    token: {ADMIN}
    keys:
      - {{name: ops, token: {OPERATOR}, role: operator}}
      - {{name: dashboards, token: {VIEWER}, role: viewer}}
    audit_log: {audit}
pools: {{a: {{model: kvgate-sim, endpoints: [{backend}]}}}}
routes: [{{model: kvgate-sim, pool: a}}]
observability: {{access_log: "off"}}
"""


async def test_roles_decide_and_every_attempted_change_is_audited(admin_gateway: Start) -> None:
    started = admin_gateway()
    url, admin, audit = started.url, started.admin, started.audit

    def as_(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", "x-request-id": f"req-{token[:4]}"}

    async with aiohttp.ClientSession() as session:
        async with session.get(f"{admin}/policy", headers=as_(VIEWER)) as response:
            assert response.status == 200  # any role reads
        for token in (VIEWER, OPERATOR):
            async with session.post(f"{admin}/reload", headers=as_(token)) as response:
                assert response.status == 403
                error = (await response.json())["error"]
                assert error["code"] == "insufficient_role" and "admin role" in error["message"]
        async with session.post(f"{admin}/reload", headers=as_("x" * 20)) as response:
            assert response.status == 401
        async with session.post(f"{admin}/reload", headers=as_(ADMIN)) as response:
            assert response.status == 200 and (await response.json())["applied"]
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(e["who"], e["role"], e["action"], e["result"]) for e in lines] == [
        ("dashboards", "viewer", "reload", "denied"),
        ("ops", "operator", "reload", "denied"),
        (None, None, "reload", "unauthenticated"),
        ("admin", "admin", "reload", "applied"),
    ]
    applied = lines[-1]
    assert (applied["before"], applied["after"]["version"]) == (1, 2)
    assert applied["request_id"] == "req-admi" and lines[0]["request_id"] == "req-view"
    counts = {
        (s.labels["action"], s.labels["result"]): s.value
        for s in scrape(url)["kvgate_admin_actions_total"]
    }
    assert counts == {
        ("reload", "denied"): 2,
        ("reload", "unauthenticated"): 1,
        ("reload", "applied"): 1,
    }


async def test_a_jwt_role_counts_only_from_the_issuers_and_audience_the_admin_names(
    admin_gateway: Start, tmp_path: Path
) -> None:
    keys = make_keys(tmp_path)
    issuers = "".join(
        f'\n    - {{issuer: "{issuer}", audience: kvgate, jwks_file: {keys.jwks_path}, '
        "algorithms: [RS256], claims: {tenant: org}}"
        for issuer in (TENANTS_IDP, STAFF_IDP)
    )
    started = admin_gateway(
        lambda text: (
            text.replace(
                "    audit_log:",
                f'    role_claim: kvgate_role\n    role_issuers: ["{STAFF_IDP}"]\n'
                "    role_audience: kvgate-admin\n    audit_log:",
            )
            + f"auth:\n  jwt:{issuers}\n"
        )
    )
    admin, audit = started.admin, started.audit

    def staff(**claims: object) -> str:
        return keys.token("RS256", None, iss=STAFF_IDP, aud=["kvgate", "kvgate-admin"], **claims)

    tokens = {
        "admin": staff(sub="alice", kvgate_role=["viewer", "admin"]),
        "operator": staff(sub="bob", kvgate_role="operator"),
        "none": staff(sub="carol"),
        "expired": staff(sub="dave", kvgate_role="admin", exp=int(time.time()) - 60),
        # a tenant's token, valid for the gateway, claiming a role its issuer cannot grant
        "tenant": keys.token(sub="mallory", kvgate_role="admin", iss=TENANTS_IDP),
        "no admin audience": keys.token(sub="erin", kvgate_role="admin", iss=STAFF_IDP),
    }
    statuses = {}
    async with aiohttp.ClientSession() as session:
        for name, token in tokens.items():
            headers = {"Authorization": f"Bearer {token}"}
            async with session.post(f"{admin}/reload", headers=headers) as response:
                statuses[name] = response.status
    assert statuses == {
        "admin": 200,
        "operator": 403,
        "none": 401,
        "expired": 401,
        "tenant": 401,
        "no admin audience": 401,
    }
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(e["who"], e["role"], e["result"]) for e in lines] == [
        ("jwt:alice", "admin", "applied"),
        ("jwt:bob", "operator", "denied"),
        *[(None, None, "unauthenticated")] * 4,
    ]


async def test_a_reload_that_removes_a_key_revokes_it_and_one_that_changes_a_role_applies_it(
    admin_gateway: Start, tmp_path: Path
) -> None:
    started = admin_gateway()
    admin, audit, text, gateway = started.admin, started.audit, started.text, started.process
    policy_file = tmp_path / "policy-0.yaml"
    moved = tmp_path / "moved-audit.jsonl"
    policy_file.write_text(
        text.replace(f"      - {{name: ops, token: {OPERATOR}, role: operator}}\n", "")
        .replace(f"token: {VIEWER}, role: viewer", f"token: {VIEWER}, role: admin")
        .replace(f"audit_log: {audit}", f"audit_log: {moved}")
    )
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{admin}/reload", headers=bearer(ADMIN)) as reload:
            assert reload.status == 200 and (await reload.json())["applied"]
        async with session.get(f"{admin}/policy", headers=bearer(OPERATOR)) as removed:
            assert removed.status == 401  # the removed key no longer opens anything
        async with session.post(f"{admin}/reload", headers=bearer(VIEWER)) as promoted:
            assert promoted.status == 200  # a viewer made admin may reload now
    lines = [json.loads(line) for line in moved.read_text().splitlines()]
    assert [(e["who"], e["role"], e["result"]) for e in lines] == [
        ("dashboards", "admin", "applied")  # the audit log moved with the policy
    ]
    # the admin section removed (the file's change reloads it): nobody may call any more
    policy_file.write_text("pools:" + text.split("pools:", 1)[1])
    status = 200
    async with aiohttp.ClientSession() as session:
        for _ in range(50):
            await asyncio.sleep(0.2)
            async with session.get(f"{admin}/policy", headers=bearer(ADMIN)) as response:
                status = response.status
            if status == 401:
                break
    assert status == 401
    assert gateway.proc is not None and gateway.proc.poll() is None


async def test_calls_nobody_authenticated_cannot_grow_labels_or_fill_the_audit_log(
    admin_gateway: Start,
) -> None:
    started = admin_gateway()
    url, admin, audit = started.url, started.admin, started.audit
    async with aiohttp.ClientSession() as session:
        for number in range(150):
            path = f"{admin}/made-up-{number}-{'x' * 200}"
            async with session.post(path, headers=bearer("y" * 20)) as response:
                assert response.status == 401
        async with session.post(f"{admin}/canaries/chat/pause") as response:
            assert response.status == 401
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert len(lines) <= UNAUTHENTICATED_PER_MINUTE  # a bounded number a minute
    assert {line["action"] for line in lines} <= {"unknown", "canaries/{model}/{action}"}
    assert all("made-up" not in json.dumps(line) for line in lines)
    counts = {
        (s.labels["action"], s.labels["result"]): s.value
        for s in scrape(url)["kvgate_admin_actions_total"]
    }
    assert counts == {
        ("unknown", "unauthenticated"): 150,  # every call counted, under one label
        ("canaries/{model}/{action}", "unauthenticated"): 1,
    }


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
