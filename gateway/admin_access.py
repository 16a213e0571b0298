"""Who calls the admin API, what their role lets them do, and the audit trail of what they did.

A caller is the key whose token their ``Authorization: Bearer`` header carries (compared in
constant time with every key's), or, with ``role_claim``, the subject of a JWT the gateway's
issuers signed whose claim names a role (a list of roles: the highest). Roles rank ``viewer`` <
``operator`` < ``admin``: a call needs at least the role its action names. Every
state-changing call, allowed or denied, becomes one JSON line (time, who, role, action, target,
before, after, result, request id) in the audit log and one count of
``kvgate_admin_actions_total{action,result}``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
from dataclasses import dataclass

from prometheus_client import Counter

from gateway.auth import Authenticator
from gateway.errors import Unauthorized
from policies.admin_section import ADMIN_ROLES, Admin

log = logging.getLogger("kvgate.audit")


@dataclass(frozen=True)
class Caller:
    name: str
    role: str

    def may(self, role: str) -> bool:
        """Whether this caller's role is at least ``role``."""
        return ADMIN_ROLES.index(self.role) >= ADMIN_ROLES.index(role)


def caller_of(
    admin: Admin, authorization: str, authenticator: Authenticator | None = None
) -> Caller | None:
    """The caller whose key ``authorization`` (the header's value) carries, or whose JWT
    ``authenticator`` verifies with a role in ``admin.role_claim``; None for anyone else."""
    given = authorization.encode()
    found = None
    for key in admin.all_keys():  # every key compared, so the time says nothing of which
        if hmac.compare_digest(given, f"Bearer {key.token}".encode()) and key.token:
            found = Caller(key.name, key.role)
    token = authorization.removeprefix("Bearer ")
    if found is None and admin.role_claim and authenticator is not None and token.count(".") == 2:
        found = _jwt_caller(authenticator, token, admin.role_claim)
    return found


def _jwt_caller(authenticator: Authenticator, token: str, claim: str) -> Caller | None:
    try:
        claims, _ = authenticator.verified_claims(token)
    except Unauthorized:
        return None
    named = claims.get(claim)
    roles = [named] if isinstance(named, str) else named if isinstance(named, list) else []
    known = [role for role in roles if role in ADMIN_ROLES]
    if not known:
        return None
    subject = claims.get("sub")
    return Caller(
        f"jwt:{subject if isinstance(subject, str) else '?'}", max(known, key=ADMIN_ROLES.index)
    )


class AuditLog:
    """Appends one JSON line per state-changing admin call to ``path`` (every worker to the
    same file: one ``write`` of one line each, opened for appending), or to the gateway's log."""

    def __init__(self, path: str | None, actions: Counter) -> None:
        self.path = path
        self.actions = actions

    async def record(
        self,
        caller: Caller | None,
        action: str,
        result: str,
        *,
        target: str = "",
        before: object = None,
        after: object = None,
        request_id: str = "",
    ) -> None:
        entry = {
            "time": time.time(),
            "who": caller.name if caller else None,
            "role": caller.role if caller else None,
            "action": action,
            "target": target,
            "before": before,
            "after": after,
            "result": result,
            "request_id": request_id,
        }
        self.actions.labels(action, result).inc()
        line = json.dumps(entry, default=str, separators=(",", ":")) + "\n"
        if self.path is None:
            log.info("%s", line.rstrip())
            return
        await asyncio.to_thread(self._append, self.path, line.encode())

    @staticmethod
    def _append(path: str, line: bytes) -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as exc:  # the action stands; its record goes to the gateway's log
            log.error("audit log %s not written (%s): %s", path, exc, line.decode().rstrip())
