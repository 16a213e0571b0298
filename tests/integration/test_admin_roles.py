"""The admin API's roles and its audit trail, on a real gateway process: a viewer reads, an
operator may not reload, the admin may; every attempted change, allowed or not, is one JSON
line of the audit log and one count of ``kvgate_admin_actions_total``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from loadtest.harness.processes import KvgateProcess, free_port
from tests.gateway.jwt_keys import make_keys
from tests.integration.metrics_util import scrape

ADMIN, OPERATOR, VIEWER = "admin-token-0123456789", "operator-token-012345", "viewer-token-0123456"


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


async def test_roles_decide_and_every_attempted_change_is_audited(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    tmp_path: Path,
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    admin_port, audit = free_port(), tmp_path / "audit.jsonl"
    url, _ = start_gateway(policy(backend, admin_port, audit))
    admin = f"http://127.0.0.1:{admin_port}/admin"

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


async def test_a_jwt_with_a_role_claim_is_a_caller_named_by_its_subject(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
    tmp_path: Path,
) -> None:
    keys = make_keys(tmp_path)
    backend = start_backend("--cost", "zero").removeprefix("http://")
    admin_port, audit = free_port(), tmp_path / "audit.jsonl"
    issuer = (
        f'auth: {{jwt: [{{issuer: "https://idp.test", audience: kvgate, '
        f"jwks_file: {keys.jwks_path}, algorithms: [RS256], claims: {{tenant: org}}}}]}}"
    )
    text = policy(backend, admin_port, audit).replace(
        f"    audit_log: {audit}", f"    audit_log: {audit}\n    role_claim: kvgate_role"
    )
    start_gateway(text + issuer + "\n")
    admin = f"http://127.0.0.1:{admin_port}/admin"
    tokens = {
        "admin": keys.token(sub="alice", kvgate_role=["viewer", "admin"]),
        "operator": keys.token(sub="bob", kvgate_role="operator"),
        "none": keys.token(sub="carol"),
        "expired": keys.token(sub="dave", kvgate_role="admin", exp=int(time.time()) - 60),
    }
    statuses = {}
    async with aiohttp.ClientSession() as session:
        for name, token in tokens.items():
            headers = {"Authorization": f"Bearer {token}"}
            async with session.post(f"{admin}/reload", headers=headers) as response:
                statuses[name] = response.status
    assert statuses == {"admin": 200, "operator": 403, "none": 401, "expired": 401}
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(e["who"], e["role"], e["result"]) for e in lines] == [
        ("jwt:alice", "admin", "applied"),
        ("jwt:bob", "operator", "denied"),
        (None, None, "unauthenticated"),
        (None, None, "unauthenticated"),
    ]
