"""The caller-facing sections: ``auth`` (API keys, JWT issuers), ``tenants`` and the priority
``classes`` they refer to."""

from __future__ import annotations

import json
import re
from pathlib import Path

from policies.fields import Fields, child
from policies.schema import (
    DEFAULT_CLASS,
    DEFAULT_CLASSES,
    JWT_ALGORITHMS,
    ApiKey,
    Auth,
    JwtIssuer,
    PriorityClass,
    Tenant,
)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def load_tenants(top: Fields) -> dict[str, Tenant]:
    tenants: dict[str, Tenant] = {}
    for path, name, value in top.entries("tenants"):
        f = Fields(top.source, value, path, {"class", "models"})
        tenants[name] = Tenant(name, f.opt_str("class"), f.str_list("models"))
    return tenants


def load_auth(top: Fields, tenants: dict[str, Tenant], base_dir: Path) -> Auth:
    f = top.sub("auth", {"api_keys", "jwt", "allow_anonymous", "anonymous_tenant"})
    keys: list[ApiKey] = []
    for path, item in f.items("api_keys"):
        k = Fields(f.source, item, path, {"sha256", "tenant", "class", "models", "name"})
        digest = k.text("sha256").lower()
        if digest and not _SHA256.match(digest):
            k.error(f"{path}.sha256", "must be 64 hex characters (the SHA-256 of the key)")
        tenant = k.text("tenant")
        if tenants and tenant and tenant not in tenants:
            k.error(f"{path}.tenant", f"unknown tenant {tenant!r}")
        name = k.text("name", f"key-{digest[:8]}")
        keys.append(ApiKey(digest, tenant, k.opt_str("class"), k.str_list("models"), name))
    digests = [k.sha256 for k in keys]
    if len(set(digests)) != len(digests):
        f.error("auth.api_keys", "the same key hash is listed twice")
    issuers = [_issuer(f, path, item, base_dir) for path, item in f.items("jwt")]
    anonymous_default = not keys and not issuers
    return Auth(
        api_keys=tuple(keys),
        jwt=tuple(issuers),
        allow_anonymous=f.flag("allow_anonymous", anonymous_default),
        anonymous_tenant=f.text("anonymous_tenant", "anonymous"),
    )


def _issuer(parent: Fields, path: str, item: object, base_dir: Path) -> JwtIssuer:
    allowed = {"issuer", "audience", "jwks_file", "jwks_url", "algorithms", "claims", "leeway"}
    f = Fields(parent.source, item, path, allowed)
    algorithms = f.str_list("algorithms") or ()
    if not algorithms:
        f.error(f"{path}.algorithms", "is required: pin the signing algorithms (e.g. [RS256])")
    for alg in algorithms:
        if alg not in JWT_ALGORITHMS:
            f.error(f"{path}.algorithms", f"unsupported algorithm {alg!r}")
    if "HS" in {a[:2] for a in algorithms} and len({a[:2] for a in algorithms}) > 1:
        f.error(f"{path}.algorithms", "do not mix HMAC (HS*) and public-key algorithms")
    jwks_url = f.opt_str("jwks_url")
    if jwks_url is not None and not jwks_url.startswith(("https://", "http://")):
        f.error(f"{path}.jwks_url", "must be an http:// or https:// URL")
    if f.has("jwks_file") == (jwks_url is not None):
        f.error(path, "needs exactly one of jwks_file and jwks_url")
    jwks_file = f.text("jwks_file") if jwks_url is None else ""
    if jwks_file:
        file = Path(jwks_file) if Path(jwks_file).is_absolute() else base_dir / jwks_file
        try:
            keys = json.loads(file.read_text()).get("keys")
            if not isinstance(keys, list) or not keys:
                f.error(f"{path}.jwks_file", "must hold a JWKS object with a non-empty 'keys' list")
        except (OSError, ValueError, AttributeError) as exc:
            f.error(f"{path}.jwks_file", f"cannot read a JWKS from {file}: {exc}")
        jwks_file = str(file)
    claims = f.sub("claims", {"tenant", "class", "models"})
    return JwtIssuer(
        issuer=f.text("issuer"),
        jwks_file=jwks_file,
        algorithms=algorithms,
        audience=f.opt_str("audience"),
        tenant_claim=claims.text("tenant", "tenant"),
        class_claim=claims.text("class", "class"),
        models_claim=claims.opt_str("models"),
        leeway=f.duration("leeway", 0.0),
        jwks_url=jwks_url,
    )


PAUSES = 2  # a configured class's streams may be paused twice each, unless it says otherwise


def load_classes(top: Fields) -> dict[str, PriorityClass]:
    if not top.has("classes"):
        return dict(DEFAULT_CLASSES)
    classes: dict[str, PriorityClass] = {}
    for path, name, value in top.entries("classes"):
        keys = {"weight", "max_queue", "max_wait", "max_pauses", "deadline"}
        f = Fields(top.source, value, path, keys)
        weight = f.number("weight", low=0.001)
        objective = f.raw("deadline") == "objective"
        deadline = f.duration("deadline") if f.has("deadline") and not objective else None
        if deadline is not None and deadline <= 0:
            f.error(child(path, "deadline"), "must be a positive duration, or 'objective'")
        classes[name] = PriorityClass(
            name,
            weight,
            f.integer("max_queue", 1000, low=1),
            f.duration("max_wait", 30.0),
            f.integer("max_pauses", PAUSES, low=0),
            deadline,
            objective,
        )
    if DEFAULT_CLASS not in classes and classes:
        top.error("classes", f"must define the default class {DEFAULT_CLASS!r}")
    return classes


def check_classes(
    top: Fields, classes: dict[str, PriorityClass], tenants: dict[str, Tenant], auth: Auth
) -> None:
    for name, tenant in tenants.items():
        if tenant.priority_class and tenant.priority_class not in classes:
            top.error(f"tenants.{name}.class", f"unknown class {tenant.priority_class!r}")
    for i, key in enumerate(auth.api_keys):
        if key.priority_class and key.priority_class not in classes:
            top.error(f"auth.api_keys[{i}].class", f"unknown class {key.priority_class!r}")
