"""API keys and JWT verification, including the classic JWT attacks."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import jwt
import pytest
from multidict import CIMultiDict

from gateway.base.errors import Unauthorized
from gateway.guards.auth import Authenticator
from policies.loader import load_policy_text
from tests.gateway.jwt_keys import Keys, make_keys

KEY = "sk-test-acme"


def policy_text(directory: Path, *, anonymous: bool = False) -> str:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    return f"""
pools: {{a: {{endpoints: [127.0.0.1:1]}}}}
routes: [{{model: m, pool: a}}, {{model: secret-model, pool: a}}]
tenants: {{acme: {{class: interactive, models: [m]}}}}
auth:
  allow_anonymous: {str(anonymous).lower()}
  api_keys: [{{sha256: {digest}, tenant: acme, name: acme-key}}]
  jwt:
    - {{issuer: "https://idp.test", audience: kvgate, jwks_file: {directory / "jwks.json"},
        algorithms: [RS256, ES256], claims: {{tenant: org, class: tier, models: models}}}}
    - {{issuer: "https://hmac.test", jwks_file: {directory / "hmac-jwks.json"},
        algorithms: [HS256]}}
"""


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return make_keys(tmp_path_factory.mktemp("jwks"))


@pytest.fixture(scope="module")
def authenticator(keys: Keys) -> Authenticator:
    return Authenticator(load_policy_text(policy_text(keys.jwks_path.parent)))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_api_key_in_either_header(authenticator: Authenticator) -> None:
    for headers in (bearer(KEY), {"api-key": KEY}):
        identity = authenticator.authenticate(headers)
        assert (identity.tenant, identity.priority_class, identity.principal) == (
            "acme",
            "interactive",
            "acme-key",
        )
        assert identity.may_use("m") and not identity.may_use("secret-model")


@pytest.mark.parametrize(
    "headers",
    [{}, bearer("sk-wrong"), {"Authorization": "Basic abc"}, {"Authorization": "Bearer "}],
)
def test_bad_api_keys(authenticator: Authenticator, headers: dict[str, str]) -> None:
    with pytest.raises(Unauthorized) as err:
        authenticator.authenticate(headers)
    assert KEY not in err.value.message and "sk-wrong" not in err.value.message


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
def test_valid_jwts(authenticator: Authenticator, keys: Keys, alg: str) -> None:
    identity = authenticator.authenticate(bearer(keys.token(alg, models=["m", "x"])))
    assert identity.tenant == "acme" and identity.method == "jwt"
    assert identity.priority_class == "interactive" and identity.models == frozenset({"m", "x"})


def _unsigned(header: dict[str, object], payload: dict[str, object]) -> str:
    def b64(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{b64(header)}.{b64(payload)}."


def _key_confusion(keys: Keys) -> str:
    """HS256 signed with the RSA public key, the classic RS/HS confusion attack."""
    import hmac as _hmac

    token = _unsigned(
        {"alg": "HS256", "kid": "rsa-1", "typ": "JWT"},
        {"iss": "https://idp.test", "aud": "kvgate", "org": "acme", "exp": 4102444800},
    )
    signing_input = token[:-1].encode()
    sig = _hmac.new(keys.rsa_public_pem(), signing_input, hashlib.sha256).digest()
    return token[:-1] + "." + base64.urlsafe_b64encode(sig).rstrip(b"=").decode()


def _tampered(token: str) -> str:
    """A valid token whose payload was swapped for another tenant's."""
    header, _, signature = token.split(".")
    forged = {"iss": "https://idp.test", "aud": "kvgate", "org": "root", "exp": 4102444800}
    payload = base64.urlsafe_b64encode(json.dumps(forged).encode()).rstrip(b"=").decode()
    return f"{header}.{payload}.{signature}"


BAD_TOKENS: dict[str, Callable[[Keys], str]] = {
    "expired": lambda k: k.token(exp=1),
    "not yet valid": lambda k: k.token(nbf=4102444800),
    "wrong audience": lambda k: k.token(aud="someone-else"),
    "unknown issuer": lambda k: k.token(iss="https://evil.test"),
    "no tenant claim": lambda k: k.token(org=None),
    "no exp": lambda k: k.token(exp=None),
    "alg none": lambda k: _unsigned(
        {"alg": "none", "kid": "rsa-1"},
        {"iss": "https://idp.test", "aud": "kvgate", "org": "acme", "exp": 4102444800},
    ),
    "HS/RS key confusion": _key_confusion,
    "alg swapped to RS on an EC key": lambda k: k.token("RS256", kid="ec-1"),
    "unknown kid": lambda k: k.token(kid="nope"),
    "tampered payload": lambda k: _tampered(k.token()),
    "garbage": lambda k: "aaa.bbb.ccc",
    "HS256 on the RSA issuer": lambda k: jwt.encode(
        {"iss": "https://idp.test", "aud": "kvgate", "org": "acme", "exp": 4102444800},
        "a shared secret of 32 bytes or more",
        algorithm="HS256",
        headers={"kid": "rsa-1"},
    ),
}


@pytest.mark.parametrize("case", list(BAD_TOKENS))
def test_bad_jwts_are_rejected(authenticator: Authenticator, keys: Keys, case: str) -> None:
    token = BAD_TOKENS[case](keys)
    with pytest.raises(Unauthorized) as err:
        authenticator.authenticate(bearer(token))
    assert token not in err.value.message


def test_hmac_issuer(authenticator: Authenticator, keys: Keys) -> None:
    token = keys.token("HS256", iss="https://hmac.test", aud=None, tenant="beta")
    assert authenticator.authenticate(bearer(token)).tenant == "beta"


def test_anonymous_only_when_allowed(keys: Keys) -> None:
    open_policy = load_policy_text(policy_text(keys.jwks_path.parent, anonymous=True))
    assert Authenticator(open_policy).authenticate({}).method == "anonymous"


def test_an_api_key_with_two_dots_is_a_key_not_a_token(keys: Keys) -> None:
    dotted = "sk.acme.two-dots"
    text = policy_text(keys.jwks_path.parent).replace(
        "api_keys: [",
        f"api_keys: [{{sha256: {hashlib.sha256(dotted.encode()).hexdigest()}, tenant: acme, "
        "name: dotted}, ",
    )
    auth = Authenticator(load_policy_text(text))
    assert auth.authenticate(bearer(dotted)).principal == "dotted"
    with pytest.raises(Unauthorized, match="Malformed token"):
        auth.authenticate(bearer("not.a.key"))  # not a key: then it must be a JWT


def test_a_token_has_one_spelling(authenticator: Authenticator, keys: Keys) -> None:
    token = keys.token()
    assert authenticator.authenticate(bearer(token)).tenant == "acme"
    for spelling in (token + "==", token.replace(".", "=.", 1)):
        with pytest.raises(Unauthorized, match="not canonical"):
            authenticator.authenticate(bearer(spelling))
    # an RS256 signature is 256 bytes: 342 characters, the last one carrying 4 spare bits;
    # flipping one of them spells the same bytes another way
    head, body, signature = token.split(".")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    twin = signature[:-1] + alphabet[alphabet.index(signature[-1]) ^ 1]
    assert len(signature) == 342 and jwt_segment_bytes(twin) == jwt_segment_bytes(signature)
    with pytest.raises(Unauthorized, match="not canonical"):
        authenticator.authenticate(bearer(f"{head}.{body}.{twin}"))


def jwt_segment_bytes(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def test_time_claims_must_be_numbers(authenticator: Authenticator, keys: Keys) -> None:
    for claim in ("exp", "nbf", "iat"):
        value = str(int(time.time()) + (300 if claim == "exp" else -10))
        with pytest.raises(Unauthorized, match=f"'{claim}' must be a number"):
            authenticator.authenticate(bearer(keys.token(**{claim: value})))


def test_a_gateway_without_auth_serves_every_client_key() -> None:
    """No keys and no issuers: the gateway does not authenticate, so the key every OpenAI
    client sends (the SDKs require one) is not a credential to check but a value to ignore."""
    open_gateway = Authenticator(
        load_policy_text("pools: {a: {endpoints: [127.0.0.1:1]}}\nroutes: [{model: m, pool: a}]")
    )
    for headers in ({"authorization": "Bearer sk-anything"}, {"api-key": "k"}, {}):
        assert open_gateway.authenticate(CIMultiDict(headers)).tenant == "anonymous"
    closed = Authenticator(
        load_policy_text(
            "pools: {a: {endpoints: [127.0.0.1:1]}}\nroutes: [{model: m, pool: a}]\n"
            "auth: {allow_anonymous: false}"
        )
    )
    with pytest.raises(Unauthorized):
        closed.authenticate(CIMultiDict({"authorization": "Bearer sk-anything"}))
