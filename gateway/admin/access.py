"""Who calls the admin API, what their role lets them do, and the audit trail of what they did.

A caller is the key whose token their ``Authorization: Bearer`` header carries (compared in
constant time with every key's), or, with ``role_claim``, the subject of a JWT one of
``role_issuers`` signed (with ``role_audience`` among its audiences, where set) whose claim
names a role (a list of roles: the highest). Roles rank ``viewer`` < ``operator`` < ``admin``:
a call needs at least the role its action names. Every state-changing call, allowed or denied,
becomes one JSON line (time, who, role, action, target, before, after, result, request id) in
the audit log and one count of ``kvgate_admin_actions_total{action,result}``; calls nobody
authenticated are recorded at most ``UNAUTHENTICATED_PER_MINUTE`` a minute (the rest are
counted, and the next line says how many were left out), so that they cannot fill a disk.
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

from gateway.base.errors import Unauthorized
from gateway.guards.auth import Authenticator
from policies.admin_section import ADMIN_ROLES, Admin

log = logging.getLogger("kvgate.audit")
UNAUTHENTICATED = "unauthenticated"  # the result of a call without a valid key or token


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
        found = _jwt_caller(admin, authenticator, token)
    return found


def _jwt_caller(admin: Admin, authenticator: Authenticator, token: str) -> Caller | None:
    try:
        claims, issuer = authenticator.verified_claims(token)
    except Unauthorized:
        return None
    if issuer.issuer not in admin.role_issuers:
        return None  # a tenant's issuer: its tokens carry no admin role, whatever they claim
    if admin.role_audience is not None:
        audience = claims.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if admin.role_audience not in audiences:
            return None
    assert admin.role_claim is not None
    named = claims.get(admin.role_claim)
    roles = [named] if isinstance(named, str) else named if isinstance(named, list) else []
    known = [role for role in roles if role in ADMIN_ROLES]
    if not known:
        return None
    subject = claims.get("sub")
    return Caller(
        f"jwt:{subject if isinstance(subject, str) else '?'}", max(known, key=ADMIN_ROLES.index)
    )


UNAUTHENTICATED_PER_MINUTE = 60  # lines of calls nobody authenticated; the rest are counted


class AuditLog:
    """Appends one JSON line per state-changing admin call to ``path`` (every worker to the
    same file: one ``write`` of one line each, opened for appending), or to the gateway's log;
    ``path`` follows the policy in force."""

    def __init__(self, path: str | None, actions: Counter) -> None:
        self.path = path
        self.actions = actions
        self._minute = 0  # the minute unauthenticated calls are being counted in
        self._unauthenticated = 0  # ... recorded in it
        self._left_out = 0  # ... not recorded since the last line

    def keeps_unauthenticated(self) -> bool:
        """Whether a call nobody authenticated gets a line (at most a bounded number a
        minute); counted either way."""
        minute = int(time.monotonic() // 60)
        if minute != self._minute:
            self._minute, self._unauthenticated = minute, 0
        self._unauthenticated += 1
        if self._unauthenticated > UNAUTHENTICATED_PER_MINUTE:
            self._left_out += 1
            return False
        return True

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
        entry: dict[str, object] = {
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
        if result == UNAUTHENTICATED:
            if not self.keeps_unauthenticated():
                return
            if self._left_out:
                entry["unauthenticated_left_out"], self._left_out = self._left_out, 0
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
