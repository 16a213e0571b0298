"""``listen.admin``: the admin API's listener, its keys and their roles, and its audit log.

``token`` is the admin key (role ``admin``, named ``admin``); ``keys`` lists more, each with a
name (who the audit log says acted) and a role: ``viewer`` reads, ``operator`` also acts on
canaries, ``admin`` also reloads the policy. With ``role_claim``, a JWT whose claim of that name
holds a role is a caller too, named by its subject — only a token of the issuers
``role_issuers`` names (each one of ``auth.jwt``'s; a tenant's token from another issuer never
is an admin), carrying ``role_audience`` among its audiences where that is set. Every
state-changing call, allowed or not, is one JSON line of ``audit_log`` (a file, appended by
every worker; by default the gateway's log). Keys, roles and the audit log apply on reload;
the listener's address after a restart.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.fields import Fields

ADMIN_ROLES = ("viewer", "operator", "admin")  # each may do what the ones before it may
MIN_TOKEN = 16  # characters


@dataclass(frozen=True)
class AdminKey:
    name: str
    token: str
    role: str  # one of ADMIN_ROLES


@dataclass(frozen=True)
class Admin:
    """The admin API: its own listener, loopback by default, guarded by its own keys."""

    host: str = "127.0.0.1"
    port: int = 8081
    token: str = ""  # required: the admin key, ``Authorization: Bearer <token>``
    keys: tuple[AdminKey, ...] = ()  # more keys, each with its role
    audit_log: str | None = None  # a file of JSON lines; None: the gateway's log
    role_claim: str | None = None  # a JWT claim naming the caller's role
    role_issuers: tuple[str, ...] = ()  # the only issuers whose tokens may carry a role
    role_audience: str | None = None  # an audience an admin token must carry, where set

    def all_keys(self) -> tuple[AdminKey, ...]:
        return (AdminKey("admin", self.token, "admin"), *self.keys)


ADMIN_FIELDS = {
    "host",
    "port",
    "token",
    "keys",
    "audit_log",
    "role_claim",
    "role_issuers",
    "role_audience",
}


def load_admin(listen: Fields, port: int, issuers: tuple[str, ...]) -> Admin:
    """``listen.admin`` (whose listener must not be ``port``, the gateway's; ``issuers``: those
    of ``auth.jwt``)."""
    a = listen.sub("admin", ADMIN_FIELDS)
    token = a.text("token", "")
    if len(token) < MIN_TOKEN:
        a.error("listen.admin.token", "is required, at least 16 characters (use ${ENV_VAR})")
    keys = []
    for path, item in a.items("keys"):
        k = Fields(a.source, item, path, {"name", "token", "role"})
        key = AdminKey(k.text("name"), k.text("token", ""), k.text("role", choices=ADMIN_ROLES))
        if len(key.token) < MIN_TOKEN:
            k.error(f"{path}.token", "is required, at least 16 characters (use ${ENV_VAR})")
        keys.append(key)
    tokens = [token, *(k.token for k in keys)]
    names = ["admin", *(k.name for k in keys)]
    if len(set(tokens)) < len(tokens):
        a.error("listen.admin.keys", "two keys share a token: each caller needs its own")
    if len(set(names)) < len(names):
        a.error("listen.admin.keys", "two keys share a name ('admin' is the token's)")
    role_claim = a.opt_str("role_claim")
    role_issuers = tuple(a.str_list("role_issuers") or ())
    if role_claim and not role_issuers:
        a.error(
            "listen.admin.role_issuers",
            "is required with role_claim: the issuers whose tokens may carry an admin role "
            "(a tenant's token must never be one)",
        )
    for number, issuer in enumerate(role_issuers):
        if issuer not in issuers:
            a.error(f"listen.admin.role_issuers[{number}]", f"{issuer!r} is not an auth.jwt issuer")
    admin = Admin(
        a.text("host", "127.0.0.1"),
        a.integer("port", 8081, low=0, high=65535),
        token,
        tuple(keys),
        a.opt_str("audit_log"),
        role_claim,
        role_issuers,
        a.opt_str("role_audience"),
    )
    if admin.port and admin.port == port:
        a.error("listen.admin.port", "must differ from listen.port")
    return admin
