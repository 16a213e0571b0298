"""Authentication: API keys (stored as SHA-256, compared in constant time) and JWTs (pyjwt).

A credential comes as ``Authorization: Bearer <credential>``, ``api-key: <credential>`` (Azure's
spelling) or ``x-api-key: <credential>`` (Anthropic's); it is looked up as an API key first (a
key may contain two dots), then verified as a JWT. A JWT must be canonical base64url (no padding
or spare bits: one token, one cache entry) and its ``exp``/``nbf``/``iat`` numbers.
A JWT is verified against its issuer's JWKS with the issuer's pinned algorithms only; the key
type must match the algorithm family, so ``none`` and HS/RS key confusion are rejected.
Messages never contain the credential.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import jwt

from gateway.base.errors import Unauthorized
from gateway.base.identity import Identity, resolve_identity
from gateway.guards.remote_jwks import KeyEntry, RemoteKeySets, parse_jwks
from policies.schema import JwtIssuer, Policy

KEY_TYPES = {"HS": "oct", "RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}
JWT_CACHE_SIZE = 10_000
NUMERIC_CLAIMS = ("exp", "nbf", "iat")  # NumericDate (RFC 7519): a number, not a string
_BASE64URL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _canonical(token: str) -> bool:
    """Whether every segment is unpadded base64url that re-encodes to itself."""
    for segment in token.split("."):
        if not segment or not _BASE64URL.issuperset(segment) or len(segment) % 4 == 1:
            return False
        raw = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != segment:
            return False
    return True


def credential_from(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("Authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        raise Unauthorized("Authorization header must be 'Bearer <key>'.")
    return headers.get("api-key") or headers.get("x-api-key") or None


class _Issuer:
    def __init__(self, config: JwtIssuer, key_sets: RemoteKeySets) -> None:
        self.config = config
        self._remote = key_sets.get(config.jwks_url) if config.jwks_url else None
        self._file_keys: dict[str | None, KeyEntry] = {}
        if self._remote is None:
            self._file_keys = parse_jwks(json.loads(Path(config.jwks_file).read_text()))

    @property
    def keys(self) -> dict[str | None, KeyEntry]:
        return self._remote.keys if self._remote is not None else self._file_keys

    def key_for(self, kid: object, alg: str) -> jwt.PyJWK:
        keys = self.keys
        if isinstance(kid, str) and kid in keys:
            key, key_alg = keys[kid]
        elif kid is None and len(keys) == 1:
            key, key_alg = next(iter(keys.values()))
        else:
            if self._remote is not None:
                self._remote.missed(kid)  # a rotation: fetch the set again soon
            raise Unauthorized("Token key id is not in the issuer's key set.")
        if KEY_TYPES.get(alg[:2]) != key.key_type or (key_alg is not None and key_alg != alg):
            raise Unauthorized("Token algorithm does not match the issuer's key.")
        return key


class Authenticator:
    """Turns request headers into an ``Identity`` or raises ``Unauthorized``."""

    def __init__(self, policy: Policy, key_sets: RemoteKeySets | None = None) -> None:
        """``key_sets``: where issuers' ``jwks_url`` keys are kept (the gateway's, shared
        across reloads)."""
        self.policy = policy
        self._keys = {key.sha256: key for key in policy.auth.api_keys}
        sets = key_sets or RemoteKeySets()
        self._issuers = {cfg.issuer: _Issuer(cfg, sets) for cfg in policy.auth.jwt}
        self._anonymous: Identity | None = None
        if policy.auth.allow_anonymous:
            tenant = policy.auth.anonymous_tenant
            self._anonymous = resolve_identity(policy, tenant, None, None, "", "anonymous")
        self._jwt_cache: OrderedDict[str, tuple[Identity, float]] = OrderedDict()
        # no keys and no issuers: nothing to check a credential against, so whatever a client
        # sends (the OpenAI SDKs always send a key) is ignored, as no key would be
        self._open = not self._keys and not self._issuers and self._anonymous is not None

    def authenticate(self, headers: Mapping[str, str]) -> Identity:
        if self._open:
            assert self._anonymous is not None
            return self._anonymous
        credential = credential_from(headers)
        if credential is None:
            if self._anonymous is not None:
                return self._anonymous
            raise Unauthorized("Missing API key: send 'Authorization: Bearer <key>'.")
        identity = self._api_key_identity(credential)  # a key may look like a JWT: keys first
        if identity is not None:
            return identity
        if self._issuers and credential.count(".") == 2:
            return self._verify_jwt(credential)
        raise Unauthorized("Invalid API key.")

    def _api_key_identity(self, credential: str) -> Identity | None:
        if not self._keys:
            return None
        digest = hashlib.sha256(credential.encode()).hexdigest()
        entry = self._keys.get(digest)
        if entry is None or not hmac.compare_digest(entry.sha256, digest):
            return None
        return resolve_identity(
            self.policy, entry.tenant, entry.priority_class, entry.models, entry.name, "api_key"
        )

    def _verify_jwt(self, token: str) -> Identity:
        cached = self._jwt_cache.get(token)
        if cached is not None and cached[1] > time.time():
            return cached[0]
        claims, cfg = self.verified_claims(token)
        identity = self._identity_from(claims, cfg)
        expires = claims["exp"]
        assert isinstance(expires, int | float)  # required, and checked to be a number
        self._remember(token, identity, float(expires))
        return identity

    def verified_claims(self, token: str) -> tuple[dict[str, object], JwtIssuer]:
        """The claims of a JWT one of the policy's issuers signed, checked as every token is
        (algorithm, key, expiry, audience, issuer); ``Unauthorized`` when it is not one."""
        if not _canonical(token):  # one token, one spelling (no padding, no spare bits)
            raise Unauthorized("Malformed token: not canonical base64url.")
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError as exc:
            raise Unauthorized("Malformed token.") from exc
        issuer_name = unverified.get("iss")
        issuer = self._issuers.get(issuer_name) if isinstance(issuer_name, str) else None
        if issuer is None:
            raise Unauthorized("Unknown token issuer.")
        cfg = issuer.config
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in cfg.algorithms:
            raise Unauthorized("Token algorithm is not allowed for this issuer.")
        key = issuer.key_for(header.get("kid"), alg)
        required = ["exp", "iss"] + (["aud"] if cfg.audience else [])
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                audience=cfg.audience,
                issuer=cfg.issuer,
                leeway=cfg.leeway,
                options={"require": required},
            )
        except jwt.ExpiredSignatureError as exc:
            raise Unauthorized("Token has expired.") from exc
        except jwt.ImmatureSignatureError as exc:
            raise Unauthorized("Token is not valid yet.") from exc
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"Invalid token: {type(exc).__name__}.") from exc
        for name in NUMERIC_CLAIMS:
            value = claims.get(name)
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            if value is not None and not numeric:
                raise Unauthorized(f"Token claim '{name}' must be a number.")
        return claims, cfg

    def _identity_from(self, claims: Mapping[str, object], cfg: JwtIssuer) -> Identity:
        tenant = claims.get(cfg.tenant_claim)
        if not isinstance(tenant, str) or not tenant:
            raise Unauthorized(f"Token has no '{cfg.tenant_claim}' claim.")
        priority_class = claims.get(cfg.class_claim)
        models = claims.get(cfg.models_claim) if cfg.models_claim else None
        model_list = (
            tuple(m for m in models if isinstance(m, str)) if isinstance(models, list) else None
        )
        subject = claims.get("sub")
        return resolve_identity(
            self.policy,
            tenant,
            priority_class if isinstance(priority_class, str) else None,
            model_list,
            subject if isinstance(subject, str) else "",
            "jwt",
        )

    def _remember(self, token: str, identity: Identity, expires: float) -> None:
        self._jwt_cache[token] = (identity, expires)
        if len(self._jwt_cache) > JWT_CACHE_SIZE:
            self._jwt_cache.popitem(last=False)
