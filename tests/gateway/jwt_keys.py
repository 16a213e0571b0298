"""Test signing keys and a JWKS file holding their public halves (made at test time)."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

HMAC_SECRET = b"kvgate-test-hmac-secret-of-32-bytes!"


@dataclass
class Keys:
    rsa_private: rsa.RSAPrivateKey
    ec_private: ec.EllipticCurvePrivateKey
    jwks_path: Path

    def rsa_public_pem(self) -> bytes:
        return self.rsa_private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def token(self, alg: str = "RS256", kid: str | None = None, **claims: object) -> str:
        now = int(time.time())
        payload = {
            "iss": "https://idp.test",
            "aud": "kvgate",
            "sub": "user-1",
            "org": "acme",
            "tier": "interactive",
            "iat": now,
            "exp": now + 300,
            **claims,
        }
        payload = {k: v for k, v in payload.items() if v is not None}
        key: object = {"RS256": self.rsa_private, "ES256": self.ec_private, "HS256": HMAC_SECRET}[
            alg
        ]
        default_kid = {"RS256": "rsa-1", "ES256": "ec-1", "HS256": "hmac-1"}[alg]
        return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid or default_kid})  # type: ignore[arg-type]


def make_keys(directory: Path) -> Keys:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key()))
    ec_jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key()))
    hmac_jwk = {"kty": "oct", "k": base64.urlsafe_b64encode(HMAC_SECRET).rstrip(b"=").decode()}
    rsa_jwk.update(kid="rsa-1", alg="RS256")
    ec_jwk.update(kid="ec-1", alg="ES256")
    hmac_jwk.update(kid="hmac-1", alg="HS256")
    path = directory / "jwks.json"
    path.write_text(json.dumps({"keys": [rsa_jwk, ec_jwk]}))
    (directory / "hmac-jwks.json").write_text(json.dumps({"keys": [hmac_jwk]}))
    return Keys(rsa_key, ec_key, path)
